"""Third-party packages the agent imports at run time (transitively).

The tools-drive builder copies exactly these top-level import names (a package directory,
or a single module file such as ``typing_extensions.py``) from the venv's site-packages
next to ``aenv/guest``. Everything else the agent uses is the standard library.
``tests/unit/guest/test_runtime_deps.py`` starts the agent's import closure in a clean
interpreter and fails if it needs anything not listed here.

- ``connectrpc``: the Connect protocol ASGI server (and its generated stubs' imports).
- ``protobuf`` + ``protobuf_ext``: protobuf-py, the message runtime, and its native
  extension (an abi3 manylinux_2_17 wheel, fine on Debian's glibc).
- ``pyqwest``: imported at module level by ``connectrpc``'s protocol code even on the
  server side (an abi3 manylinux_2_28 wheel).
- ``typing_extensions``: imported by protobuf-py.
- ``uvicorn`` + ``httptools`` + ``h11`` + ``click``: the HTTP/1.1 server. httptools is its
  C parser (a cp311 manylinux2014 wheel), h11 the pure-Python fallback (``--http h11``);
  uvicorn imports click in its config module.
"""

from __future__ import annotations

RUNTIME_PACKAGES: tuple[str, ...] = (
    "connectrpc",
    "protobuf",
    "protobuf_ext",
    "pyqwest",
    "typing_extensions",
    "uvicorn",
    "h11",
    "click",
    "httptools",
)

__all__ = ["RUNTIME_PACKAGES"]
