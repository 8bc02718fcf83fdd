"""Where teams and keys live: the node's database (`TeamStore`, on orchestrator/store.py's
connection), or a cluster's etcd (cluster/teams.py), behind one interface (`Teams`): reads
are synchronous (every request asks who it comes from), changes are not.

Keys are looked up by their SHA-256 on every request, with no cache: a revoked key is
refused from the next request on.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
import uuid
from typing import Any, Protocol

from aenv.teams.model import (
    DEFAULT_TEAM,
    NODE_KEY_ID,
    ApiKey,
    Principal,
    Team,
    TeamError,
    TeamExists,
    TeamNotFound,
    check_limit,
    check_name,
    check_registries,
    key_hash,
    mask,
    new_key,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS teams (
    team_id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    max_sandboxes INTEGER,
    max_memory_mib INTEGER,
    created_us INTEGER NOT NULL,
    image_registries TEXT  -- a JSON list; NULL: the node's image_registries
);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY,
    team_id TEXT NOT NULL REFERENCES teams(team_id),
    name TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    mask TEXT NOT NULL,
    admin INTEGER NOT NULL,
    created_us INTEGER NOT NULL,
    revoked_us INTEGER
);
"""
_TEAM_COLS = "team_id, name, max_sandboxes, max_memory_mib, created_us, image_registries"
_KEY_COLS = "key_id, team_id, name, mask, admin, created_us, revoked_us"


class KeyNotFound(TeamError):
    status = 404


class Teams(Protocol):
    """TeamError (400) on bad input, TeamNotFound and KeyNotFound (404), TeamExists (409)."""

    def principal(self, key: str) -> Principal | None: ...

    def team(self, ref: str) -> Team: ...

    def teams(self) -> list[Team]: ...

    def key(self, key_id: str) -> ApiKey: ...

    def keys(self, team_ref: str | None = None) -> list[ApiKey]: ...

    async def bind_node_key(self, key: str) -> None: ...

    async def create_team(self, name: object, max_sandboxes: object = None,
                          max_memory_mib: object = None, image_registries: object = None
                          ) -> Team: ...  # fmt: skip

    async def set_limits(self, ref: str, **changes: object) -> Team: ...

    async def delete_team(self, ref: str) -> Team: ...

    async def create_key(self, team_ref: str, name: object = "", admin: bool = False
                         ) -> tuple[ApiKey, str]: ...  # fmt: skip

    async def revoke(self, key_id: str) -> ApiKey: ...


def limit_changes(team: Team, changes: dict[str, object]) -> dict[str, object]:
    """`changes` ({max_sandboxes, max_memory_mib}: None removes a limit; image_registries:
    None gives the team the node's list) checked."""
    names = {"max_sandboxes": "maxSandboxes", "max_memory_mib": "maxMemoryMB"}
    unknown = set(changes) - set(names) - {"image_registries"}
    if unknown:
        raise TeamError(f"unknown limit {sorted(unknown)[0]!r}")
    return {k: check_registries(v) if k == "image_registries" else check_limit(v, names[k])
            for k, v in changes.items()}  # fmt: skip


def registries_json(value: tuple[str, ...] | None) -> str | None:
    return None if value is None else json.dumps(list(value))


def registries_of(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(json.loads(text))


def check_deletable(team: Team) -> None:
    if team.team_id == DEFAULT_TEAM:
        raise TeamError("the default team cannot be deleted")


def check_revocable(key_id: str) -> None:
    if key_id == NODE_KEY_ID:
        raise TeamError("the node's own key is changed through its file (or "
                        "AENV_API_KEY) and a restart, not revoked")  # fmt: skip


def _now_us() -> int:
    return time.time_ns() // 1000


def _team(row: tuple[Any, ...]) -> Team:
    *fields, registries = row
    return Team(*fields, registries_of(registries))


def _key(row: tuple[Any, ...]) -> ApiKey:
    kid, team, name, msk, admin, created, revoked = row
    return ApiKey(kid, team, name, msk, bool(admin), created, revoked)


class TeamStore:
    def __init__(self, db: sqlite3.Connection) -> None:
        """`db`: the node's database, autocommit, foreign keys on."""
        self._db = db
        self._db.executescript(_SCHEMA)
        if "image_registries" not in {r[1] for r in self._db.execute("PRAGMA table_info(teams)")}:
            self._db.execute("ALTER TABLE teams ADD COLUMN image_registries TEXT")  # older
        with self._db:
            self._db.execute("INSERT OR IGNORE INTO teams (team_id, name, created_us) "
                             "VALUES (?, ?, ?)", (DEFAULT_TEAM, DEFAULT_TEAM, _now_us()))

    # -- the node's own key ----------------------------------------------------------------

    async def bind_node_key(self, key: str) -> None:
        """The node's key (its file or AENV_API_KEY) is the default team's admin key; a new
        one replaces the old at start."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM api_keys WHERE key_id=?", (NODE_KEY_ID,))
            self._db.execute("DELETE FROM api_keys WHERE hash=?", (key_hash(key),))
            self._db.execute("INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, 1, ?, NULL)",
                             (NODE_KEY_ID, DEFAULT_TEAM, "the node's key", key_hash(key),
                              mask(key), _now_us()))  # fmt: skip

    def key_hashes(self) -> dict[str, str]:
        """Each key's stored digest by key id (to carry the keys into a cluster)."""
        return dict(self._db.execute("SELECT key_id, hash FROM api_keys").fetchall())

    # -- requests --------------------------------------------------------------------------

    def principal(self, key: str) -> Principal | None:
        """Who `key` belongs to; None for an unknown or revoked key."""
        row = self._db.execute(
            "SELECT team_id, key_id, admin FROM api_keys WHERE hash=? AND revoked_us IS NULL",
            (key_hash(key),)).fetchone()  # fmt: skip
        return None if row is None else Principal(row[0], row[1], bool(row[2]))

    # -- teams -----------------------------------------------------------------------------

    async def create_team(self, name: object, max_sandboxes: object = None,
                          max_memory_mib: object = None, image_registries: object = None
                          ) -> Team:  # fmt: skip
        name = check_name(name)
        limits = (check_limit(max_sandboxes, "maxSandboxes"),
                  check_limit(max_memory_mib, "maxMemoryMB"))
        registries = registries_json(check_registries(image_registries))
        tid = str(uuid.uuid4())
        try:
            with self._db:
                self._db.execute(f"INSERT INTO teams ({_TEAM_COLS}) VALUES (?, ?, ?, ?, ?, ?)",
                                 (tid, name, *limits, _now_us(), registries))  # fmt: skip
        except sqlite3.IntegrityError:
            raise TeamExists(f"a team named {name!r} exists") from None
        return self.team(tid)

    def team(self, ref: str) -> Team:
        """By id or by name."""
        row = self._db.execute(f"SELECT {_TEAM_COLS} FROM teams WHERE team_id=? OR name=?",
                               (ref, ref)).fetchone()  # fmt: skip
        if row is None:
            raise TeamNotFound(f"team {ref!r} not found")
        return _team(row)

    def teams(self) -> list[Team]:
        rows = self._db.execute(f"SELECT {_TEAM_COLS} FROM teams ORDER BY created_us, team_id")
        return [_team(r) for r in rows.fetchall()]

    async def set_limits(self, ref: str, **changes: object) -> Team:
        """Changes the limits given (None: no limit); leaves the others."""
        team = self.team(ref)
        checked = limit_changes(team, changes)
        if "image_registries" in checked:
            checked["image_registries"] = registries_json(checked["image_registries"])  # type: ignore[arg-type]
        if checked:
            with self._db:
                self._db.execute(
                    f"UPDATE teams SET {', '.join(f'{k}=?' for k in checked)} WHERE team_id=?",
                    (*checked.values(), team.team_id))  # fmt: skip
        return self.team(team.team_id)

    async def delete_team(self, ref: str) -> Team:
        """Removes a team and its keys; the caller checks it owns nothing."""
        team = self.team(ref)
        check_deletable(team)
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM api_keys WHERE team_id=?", (team.team_id,))
            self._db.execute("DELETE FROM teams WHERE team_id=?", (team.team_id,))
        return team

    # -- keys ------------------------------------------------------------------------------

    async def create_key(self, team_ref: str, name: object = "", admin: bool = False
                         ) -> tuple[ApiKey, str]:  # fmt: skip
        """A new key of the team: its record and the key itself, which is stored nowhere."""
        team = self.team(team_ref)
        name = check_name(name, "key") if name else "key"
        key, kid = new_key(), "key_" + secrets.token_hex(8)
        with self._db:
            self._db.execute("INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
                             (kid, team.team_id, name, key_hash(key), mask(key), int(admin),
                              _now_us()))  # fmt: skip
        return self.key(kid), key

    def key(self, key_id: str) -> ApiKey:
        row = self._db.execute(f"SELECT {_KEY_COLS} FROM api_keys WHERE key_id=?",
                               (key_id,)).fetchone()  # fmt: skip
        if row is None:
            raise KeyNotFound(f"key {key_id!r} not found")
        return _key(row)

    def keys(self, team_ref: str | None = None) -> list[ApiKey]:
        if team_ref is None:
            rows = self._db.execute(f"SELECT {_KEY_COLS} FROM api_keys "
                                    "ORDER BY created_us, key_id").fetchall()  # fmt: skip
        else:
            rows = self._db.execute(f"SELECT {_KEY_COLS} FROM api_keys WHERE team_id=? "
                                    "ORDER BY created_us, key_id",
                                    (self.team(team_ref).team_id,)).fetchall()  # fmt: skip
        return [_key(r) for r in rows]

    async def revoke(self, key_id: str) -> ApiKey:
        """From the next request on the key is refused; its record stays, marked."""
        check_revocable(key_id)
        key = self.key(key_id)
        if key.revoked_us is None:
            with self._db:
                self._db.execute("UPDATE api_keys SET revoked_us=? WHERE key_id=?",
                                 (_now_us(), key_id))
        return self.key(key_id)
