"""What tests do inside a guest through the SDK: hold a connection open across an update,
wait for a condition."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable

from e2b import Sandbox

# Holds one connection to the server open (a request begun), until /tmp/go appears; then
# finishes the request and writes what came back, or the error, to /tmp/r.
HOLD = textwrap.dedent("""
    import errno, os, socket, sys, time
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    s.sendall(b"GET / HTTP/1.1\\r\\n")
    open("/tmp/c", "w").write("up")
    while not os.path.exists("/tmp/go"):
        time.sleep(0.05)
    try:
        s.sendall(b"Host: x\\r\\n\\r\\n")
        r = "got " + s.recv(64).decode(errors="replace").split("\\r\\n")[0]
    except OSError as e:
        r = errno.errorcode.get(e.errno, str(e))
    open("/tmp/r", "w").write(r)
""")


def held_connection(sbx: Sandbox, addr: str, port: int,
                    meanwhile: Callable[[], object] | None = None) -> str:  # fmt: skip
    """Open a connection from the guest, run `meanwhile` (an update), then finish the
    request: the status line it got, or the errno's name (ECONNRESET)."""
    sbx.files.write("/tmp/hold.py", HOLD)
    sbx.commands.run("rm -f /tmp/c /tmp/go /tmp/r")
    sbx.commands.run(f"python3 /tmp/hold.py {addr} {port}", background=True, timeout=0)
    until(lambda: sbx.commands.run("cat /tmp/c 2>/dev/null || true").stdout == "up")
    if meanwhile is not None:
        meanwhile()
    sbx.commands.run("touch /tmp/go")
    until(lambda: sbx.commands.run("cat /tmp/r 2>/dev/null || true").stdout != "")
    return sbx.commands.run("cat /tmp/r").stdout


def until(cond: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
