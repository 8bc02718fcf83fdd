"""aenv orchestrator plane."""
