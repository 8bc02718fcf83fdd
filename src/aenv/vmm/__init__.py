"""aenv vmm plane."""
