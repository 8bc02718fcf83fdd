"""aenv guest plane."""
