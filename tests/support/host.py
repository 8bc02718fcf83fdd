"""Host-side helpers shared by the suites that start real nodes."""

from __future__ import annotations

import os
import socket
from pathlib import Path

DATA_DIR = Path(os.environ.get("AENV_DATA_DIR", "/var/lib/aenv"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def qemu_pids(instance: str | None = None, data_dir: Path = DATA_DIR) -> set[int]:
    """QEMU processes running a sandbox of this data directory (others' QEMUs don't count);
    with `instance`, only that node instance's (other nodes on the host may be booting)."""
    marker = str(data_dir / "sandboxes" / (instance or "")).rstrip("/").encode()
    marker += b"/" if instance else b""
    pids = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"qemu-system" in argv[0] and any(marker in a for a in argv):
            pids.add(int(p.name))
    return pids
