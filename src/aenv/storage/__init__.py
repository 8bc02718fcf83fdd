"""aenv storage plane."""
