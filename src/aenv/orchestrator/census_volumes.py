"""The census's volume servers (volumes/server.py): each slot's state directory under
`<data>/run/volumes/<instance>-<slot>/` and the server and rpcbind running from it (one
process group, led by ganesha.nfsd, whose command line names the directory)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

_DIR = re.compile(r"(?P<inst>[a-z0-9][a-z0-9-]*)-(?P<slot>\d+)")


def volume_servers(data: Path, mine: Callable[[str], bool]) -> list[tuple[str, str, str, str]]:
    """(name, instance, owner, detail) of each state directory and server process."""
    root = data / "run" / "volumes"
    out: list[tuple[str, str, str, str]] = []
    try:
        dirs = sorted(root.iterdir())
    except FileNotFoundError:
        dirs = []
    for d in dirs:
        if (m := _DIR.fullmatch(d.name)) and mine(m["inst"]):
            out.append((str(d), m["inst"], d.name, "state directory"))
    leaders: dict[int, tuple[str, str]] = {}
    groups: list[tuple[int, int, str]] = []
    marker = str(root) + "/"
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().decode(errors="replace").split("\0")
            pgid = os.getpgid(int(p.name))
        except (OSError, ValueError):
            continue
        exe = os.path.basename(argv[0]) if argv else ""
        groups.append((int(p.name), pgid, exe))
        for a in argv:
            if exe == "ganesha.nfsd" and a.startswith(marker):
                name = a[len(marker):].split("/")[0]
                if (m := _DIR.fullmatch(name)) and mine(m["inst"]):
                    leaders[int(p.name)] = (m["inst"], name)
    for pid, pgid, exe in groups:
        if pgid in leaders:
            inst, name = leaders[pgid]
            out.append((str(pid), inst, name, exe))
    return out
