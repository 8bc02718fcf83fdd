"""aenv: microVM sandboxes for AI agents, speaking the E2B API."""

__version__ = "0.1.0"
