"""aenv cli plane."""
