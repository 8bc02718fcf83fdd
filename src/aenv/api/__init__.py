"""aenv api plane."""
