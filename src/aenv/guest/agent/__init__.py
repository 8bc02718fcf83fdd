"""The aenv guest agent: E2B envd's protocol on TCP 49983, inside every sandbox.

Runs on the tools drive's Python, so it imports only the standard library, ``aenv.guest``
and the packages named in ``runtime_deps.RUNTIME_PACKAGES``. See docs/agent.md.
"""

from __future__ import annotations

import sys
import types

# connectrpc reads its own version from package metadata at import time. The tools drive
# carries packages, not their *.dist-info (and scanning sys.path for metadata costs tens of
# milliseconds under TCG), so provide the module up front. It must equal the pinned
# version; tests/unit/guest/test_runtime_deps.py checks that it does.
CONNECTRPC_VERSION = "0.12.1"

if "connectrpc._version" not in sys.modules:
    _version = types.ModuleType("connectrpc._version")
    _version.__version__ = CONNECTRPC_VERSION  # type: ignore[attr-defined]
    sys.modules["connectrpc._version"] = _version
