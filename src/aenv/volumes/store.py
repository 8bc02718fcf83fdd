"""Volumes: named directories that outlive sandboxes, mounted into them over NFS
(volumes/server.py) and read and written through the content API (volumes/tree.py).

A volume's record (id, name) lives in the node's database; its data in
`<volumes_dir>/<volume id>/`. Its content token is not stored: it is an HMAC of the id under
the node's secrets key, so every node holding that key (a cluster's nodes share it) accepts
it, and it cannot be read back from a database dump.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import re
import secrets
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aenv.teams.migrate import scope_by_team

ID_PREFIX = "vol_"
TOKEN_PREFIX = "vtok_"
# E2B's names: the SDK checks nothing; a name goes into mounts and paths, so keep it plain.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# Data owned like the sandboxes' default user, so `user` writes a fresh volume.
DEFAULT_UID = DEFAULT_GID = 1000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS volumes (
    volume_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_us INTEGER NOT NULL,
    team_id TEXT NOT NULL,
    UNIQUE (team_id, name)
);
"""


class VolumeError(ValueError):
    status = 400


class VolumeNotFound(VolumeError):
    status = 404


class VolumeExists(VolumeError):
    status = 409


class VolumeInUse(VolumeError):
    status = 409


@dataclass(frozen=True)
class VolumeInfo:
    volume_id: str
    name: str
    created_us: int


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise VolumeError(f"volume name {name!r}: 1 to 128 letters, digits, '_', '.' or '-', "
                          "starting with a letter or digit")
    if name.startswith(ID_PREFIX):
        raise VolumeError(f"volume name {name!r}: the prefix {ID_PREFIX!r} is for volume ids")
    return name


def token_for(key: bytes, volume_id: str) -> str:
    mac = hmac.new(key, b"aenv-volume-token:" + volume_id.encode(), hashlib.sha256)
    return TOKEN_PREFIX + mac.hexdigest()[:48]


def token_ok(key: bytes, volume_id: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(given.encode(),
                                                     token_for(key, volume_id).encode())


class Volumes(Protocol):
    """Where a node's volume records live. VolumeError on bad input, VolumeNotFound,
    VolumeExists."""

    root: Path

    async def create(self, name: object, team_id: str) -> VolumeInfo: ...

    async def get(self, ref: str, team_id: str | None) -> VolumeInfo: ...

    async def list(self, team_id: str) -> list[VolumeInfo]: ...

    async def delete(self, ref: str, team_id: str) -> None: ...

    def count(self, team_id: str) -> int: ...

    async def users_elsewhere(self, volume_id: str) -> list[str]:
        """Sandboxes of other nodes that mount it (a cluster's nodes); VolumeInUse if
        that cannot be told."""
        ...


class VolumeStore:
    def __init__(self, db: sqlite3.Connection, root: Path) -> None:
        """`db`: the node's database (autocommit); `root`: where volumes' data lives."""
        self._db = db
        scope_by_team(db, "volumes", _SCHEMA)
        self._db.executescript(_SCHEMA)
        self.root = root

    def data_dir(self, volume_id: str) -> Path:
        return self.root / volume_id

    async def create(self, name: object, team_id: str) -> VolumeInfo:
        """A volume of the team's (names are unique within a team)."""
        name = check_name(name)
        vid = ID_PREFIX + secrets.token_hex(10)
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.data_dir(vid)
        path.mkdir(mode=0o755)
        os.chown(path, DEFAULT_UID, DEFAULT_GID)
        try:
            with self._db:
                self._db.execute("INSERT INTO volumes VALUES (?, ?, ?, ?)",
                                 (vid, name, time.time_ns() // 1000, team_id))  # fmt: skip
        except sqlite3.IntegrityError:
            path.rmdir()
            raise VolumeExists(f"a volume named {name!r} exists") from None
        return await self.get(vid, team_id)

    async def get(self, ref: str, team_id: str | None) -> VolumeInfo:
        """The team's volume by id or by name; with no team (the content API, whose token
        is the volume's own), by id only."""
        if team_id is None:
            row = self._db.execute("SELECT volume_id, name, created_us FROM volumes "
                                   "WHERE volume_id=?", (ref,)).fetchone()  # fmt: skip
        else:
            row = self._db.execute(
                "SELECT volume_id, name, created_us FROM volumes "
                "WHERE (volume_id=? OR name=?) AND team_id=?", (ref, ref, team_id)).fetchone()
        if row is None:
            raise VolumeNotFound(f"volume {ref!r} not found")
        return VolumeInfo(*row)

    async def list(self, team_id: str) -> list[VolumeInfo]:
        rows = self._db.execute("SELECT volume_id, name, created_us FROM volumes "
                                "WHERE team_id=? ORDER BY created_us, volume_id",
                                (team_id,)).fetchall()  # fmt: skip
        return [VolumeInfo(*r) for r in rows]

    async def users_elsewhere(self, volume_id: str) -> list[str]:
        return []  # a node alone: there is no elsewhere

    def count(self, team_id: str) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM volumes WHERE team_id=?",
                                    (team_id,)).fetchone()[0])  # fmt: skip

    async def delete(self, ref: str, team_id: str) -> None:
        """The record first, then the data: a crash in between leaves a directory no
        record names, which `orphans` finds (the census), never a record without data."""
        info = await self.get(ref, team_id)
        with self._db:
            self._db.execute("DELETE FROM volumes WHERE volume_id=?", (info.volume_id,))
        await asyncio.to_thread(shutil.rmtree, self.data_dir(info.volume_id), True)

    def all(self) -> list[tuple[VolumeInfo, str]]:
        """Every volume with its team (to carry them into a cluster)."""
        rows = self._db.execute("SELECT volume_id, name, created_us, team_id FROM volumes "
                                "ORDER BY created_us").fetchall()  # fmt: skip
        return [(VolumeInfo(*r[:3]), r[3]) for r in rows]

    def orphans(self) -> list[Path]:
        """Data directories no record names (a delete cut short)."""
        known = {r[0] for r in self._db.execute("SELECT volume_id FROM volumes")}
        try:
            return [p for p in self.root.iterdir()
                    if p.name.startswith(ID_PREFIX) and p.name not in known]  # fmt: skip
        except FileNotFoundError:
            return []
