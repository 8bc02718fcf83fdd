"""Volume mounts of sandboxes: what a create may ask for, and which sandboxes mount which
volume (their records say; volumes/ has the data and the server)."""

from __future__ import annotations

import json
import posixpath
import sqlite3

from aenv.orchestrator.errors import InvalidRequest, NotFound
from aenv.orchestrator.store import Store
from aenv.volumes.store import VolumeNotFound, Volumes

MAX_MOUNTS = 8
# A mount over these would hide what the guest runs on (or the agent's tools).
_SYSTEM_TREES = ("/proc", "/sys", "/dev", "/run", "/.aenv")
_SYSTEM_DIRS = frozenset({"/", "/bin", "/boot", "/etc", "/home", "/lib", "/lib32", "/lib64",
                          "/root", "/sbin", "/tmp", "/usr", "/var", "/usr/bin", "/usr/lib",
                          "/usr/local", "/usr/sbin", "/var/lib"})  # fmt: skip


def check_path(path: object) -> str:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise InvalidRequest(f"volume mount path {path!r} must be an absolute path")
    norm = posixpath.normpath(path)
    if len(norm) > 1024:
        raise InvalidRequest("a volume mount path is at most 1024 characters")
    if norm in _SYSTEM_DIRS or any(norm == t or norm.startswith(t + "/") for t in _SYSTEM_TREES):
        raise InvalidRequest(f"volume mount path {path!r} is a system directory: mount it "
                             "elsewhere (e.g. /mnt/<name> or /home/user/<name>)")  # fmt: skip
    return norm


async def resolve(volumes: Volumes | None, raw: list[object], team_id: str
                  ) -> list[tuple[str, str, str]]:  # fmt: skip
    """E2B's `volumeMounts` ([{name, path}]) as (name, path, volume id); 400 for a bad one,
    404 for a volume the team does not have."""
    if not raw:
        return []
    if volumes is None:
        raise InvalidRequest("this node has no volumes")
    if len(raw) > MAX_MOUNTS:
        raise InvalidRequest(f"at most {MAX_MOUNTS} volume mounts")
    out: list[tuple[str, str, str]] = []
    for m in raw:
        if not isinstance(m, dict) or not isinstance(m.get("name"), str):
            raise InvalidRequest("each volume mount is {name, path}")
        path = check_path(m.get("path"))
        if any(p == path for _, p, _ in out):
            raise InvalidRequest(f"two volumes mounted at {path}")
        try:
            info = await volumes.get(m["name"], team_id)
        except VolumeNotFound:
            raise NotFound(f"volume {m['name']!r} not found") from None
        out.append((info.name, path, info.volume_id))
    return out


def volume_users(store: Store, volume_id: str) -> list[str]:
    """Ids of the sandboxes, running or paused (every record is one), that mount it."""
    return sorted(r.sandbox_id for r in store.all()
                  if any(v == volume_id for _, _, v in r.volume_mounts))


_SCHEMA = """CREATE TABLE IF NOT EXISTS snapshot_volumes (
    snapshot_id TEXT PRIMARY KEY, mounts TEXT NOT NULL)"""


def remember(db: sqlite3.Connection, snapshot_id: str,
             volume_mounts: list[tuple[str, str, str]]) -> None:  # fmt: skip
    """The source's mounts, for what is created from the snapshot: its guest memory (or its
    disk's mount points) expects them, and they are the live volumes, not copies."""
    if volume_mounts:
        db.execute(_SCHEMA)
        db.execute("INSERT OR REPLACE INTO snapshot_volumes VALUES (?, ?)",
                   (snapshot_id, json.dumps(volume_mounts)))  # fmt: skip


def of_snapshot(db: sqlite3.Connection, snapshot_id: str) -> list[tuple[str, str, str]]:
    db.execute(_SCHEMA)
    row = db.execute("SELECT mounts FROM snapshot_volumes WHERE snapshot_id=?",
                     (snapshot_id,)).fetchone()  # fmt: skip
    return [tuple(m) for m in json.loads(row[0])] if row else []  # type: ignore[misc]


def merge(inherited: list[tuple[str, str, str]],
          asked: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:  # fmt: skip
    """A snapshot's mounts plus a create's own; 400 if both mount at one path."""
    taken = {p for _, p, _ in inherited}
    for _, p, _ in asked:
        if p in taken:
            raise InvalidRequest(f"the snapshot already mounts a volume at {p}")
    if len(inherited) + len(asked) > MAX_MOUNTS:
        raise InvalidRequest(f"at most {MAX_MOUNTS} volume mounts")
    return [*inherited, *asked]
