"""Volume mounts POST /init asks for (`aenvVolumes`): NFSv3 from the node's server at the
guest's gateway (aenv/volumes/server.py). A mount that is already there (a guest restored
from memory or forked keeps its mounts; its kernel reconnects by itself) is left alone, so
every start may send the same list."""

from __future__ import annotations

import ctypes
import os

GATEWAY = "169.254.0.22"
NFS_PORT, MOUNT_PORT = 2049, 20048
# hard: a paused or restarting server makes I/O wait, never fail. actimeo=1 and positive-only
# lookups: another sandbox's writes show within a second (close-to-open covers file data).
OPTIONS = (f"vers=3,proto=tcp,port={NFS_PORT},mountport={MOUNT_PORT},mountproto=tcp,"
           f"nolock,hard,timeo=50,retrans=3,actimeo=1,lookupcache=positive,"
           f"addr={GATEWAY},mountaddr={GATEWAY}")  # fmt: skip

_libc = ctypes.CDLL(None, use_errno=True)


class MountError(ValueError):
    pass


def mounted() -> dict[str, str]:
    """Mount point -> source, for the NFS mounts in /proc/self/mounts."""
    out: dict[str, str] = {}
    with open("/proc/self/mounts") as f:
        for line in f:
            src, target, fstype = line.split()[:3]
            if fstype == "nfs":
                out[target.replace("\\040", " ")] = src
    return out


def ensure(volumes: object) -> None:
    """Mount each `{source, path}` not yet mounted there. MountError on bad input or a
    failed mount (its errno's text)."""
    if not isinstance(volumes, list):
        raise MountError("aenvVolumes must be a list")
    have = mounted()
    for v in volumes:
        if not isinstance(v, dict) or not isinstance(v.get("source"), str) \
                or not isinstance(v.get("path"), str) or not v["path"].startswith("/"):
            raise MountError("each of aenvVolumes is {source, path} with an absolute path")
        path = os.path.normpath(v["path"])
        source = f"{GATEWAY}:{v['source']}"
        if have.get(path) == source:
            continue
        os.makedirs(path, exist_ok=True)
        rc = _libc.mount(source.encode(), path.encode(), b"nfs", 0, OPTIONS.encode())
        if rc != 0:
            err = ctypes.get_errno()
            raise MountError(f"mounting {v['source']} at {path}: {os.strerror(err)}")
