"""The envd protocol version the agent reports (the node imports ENVD_VERSION from here).

The SDK turns features on by this number (e2b-compat.md section 7). "0.6.4" is the highest
gate the 2.63.0 SDK knows about: recursive watch (0.1.4), metrics (0.2.4), stdin control
(0.3.0), default user (0.4.0), close_stdin (0.5.2), octet-stream/gzip uploads (0.5.7), file
metadata (0.6.2), watch entries (0.6.3) and watching network mounts (0.6.4). The agent
implements all of them, and the integration tests exercise each one.
"""

from __future__ import annotations

ENVD_VERSION = "0.6.4"

__all__ = ["ENVD_VERSION"]
