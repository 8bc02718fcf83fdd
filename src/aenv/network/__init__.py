"""aenv network plane."""
