"""Secrets: named, versioned, write-only values, stored encrypted (vault.py) in the node's
database, beside its sandboxes (one file: what removes a node's state removes them too).

E2B's rules: a name is unique, lower-cased, free of `{`, `}` and control characters (it
goes into the `${e2b.secrets.<name>}` placeholder), and never starts with `sec_`, the
prefix of ids; an id or a name finds a secret. Every update stores a new version; readers
that name none get the current one. Values never leave the node except into the egress
proxy's outbound requests (`network.rules`).
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass
from typing import Protocol

from aenv.secrets.vault import Vault
from aenv.teams.migrate import scope_by_team

ID_PREFIX = "sec_"
MAX_NAME = 255
MAX_VALUE = 64 * 1024
MAX_META_ENTRIES, MAX_META_KEY, MAX_META_VALUE, MAX_META_TOTAL = 32, 128, 1024, 8192
MAX_LIMIT = 100
_BAD_NAME = re.compile(r"[{}\x00-\x1f\x7f-\x9f]")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS secrets (
    secret_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    current_version INTEGER NOT NULL,
    metadata TEXT NOT NULL,
    created_us INTEGER NOT NULL,
    updated_us INTEGER NOT NULL,
    team_id TEXT NOT NULL,
    UNIQUE (team_id, name)
);
CREATE TABLE IF NOT EXISTS secret_versions (
    secret_id TEXT NOT NULL REFERENCES secrets(secret_id) ON DELETE CASCADE,
    version INTEGER NOT NULL,
    sealed BLOB NOT NULL,
    PRIMARY KEY (secret_id, version)
);
"""


class SecretError(ValueError):
    status = 400


class SecretNotFound(SecretError):
    status = 404


class SecretExists(SecretError):
    status = 409


@dataclass(frozen=True)
class SecretInfo:
    secret_id: str
    name: str
    version: int
    metadata: dict[str, str]
    created_us: int
    updated_us: int


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise SecretError("a secret name must be a non-empty string")
    name = name.strip().lower()
    if len(name) > MAX_NAME or _BAD_NAME.search(name):
        raise SecretError(f"secret name {name!r}: at most {MAX_NAME} characters, without "
                          "'{', '}' or control characters (it goes into "
                          "'${e2b.secrets.<name>}')")
    if name.startswith(ID_PREFIX):
        raise SecretError(f"secret name {name!r}: the prefix {ID_PREFIX!r} is for secret ids")
    return name


def check_value(value: object) -> bytes:
    if not isinstance(value, str) or not value:
        raise SecretError("a secret value must be a non-empty string")
    data = value.encode()
    if len(data) > MAX_VALUE:
        raise SecretError(f"a secret value is at most {MAX_VALUE} bytes")
    return data


def check_metadata(meta: object) -> dict[str, str]:
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in meta.items()):  # fmt: skip
        raise SecretError("secret metadata must map strings to strings")
    if len(meta) > MAX_META_ENTRIES:
        raise SecretError(f"secret metadata holds at most {MAX_META_ENTRIES} entries")
    total = 0
    for k, v in meta.items():
        kb, vb = len(k.encode()), len(v.encode())
        if not kb or kb > MAX_META_KEY or vb > MAX_META_VALUE:
            raise SecretError(f"secret metadata: keys are 1 to {MAX_META_KEY} bytes, values "
                              f"at most {MAX_META_VALUE}")
        total += kb + vb
    if total > MAX_META_TOTAL:
        raise SecretError(f"secret metadata is at most {MAX_META_TOTAL} bytes in all")
    return dict(meta)


def _now_us() -> int:
    return time.time_ns() // 1000


class Secrets(Protocol):
    """Where a node's secrets live: its database (SecretStore), or its cluster's etcd
    (cluster/secrets.py). Each belongs to a team (names are unique within it) and is found
    only by that team. SecretError on bad input, SecretNotFound, SecretExists."""

    async def create(self, team_id: str, name: object, value: object, metadata: object = None
                     ) -> SecretInfo: ...  # fmt: skip

    async def update(self, team_id: str, ref: str, value: object, metadata: object = None
                     ) -> SecretInfo: ...  # fmt: skip

    async def delete(self, team_id: str, ref: str) -> None: ...

    async def get(self, team_id: str, ref: str) -> SecretInfo: ...

    async def page(self, team_id: str, limit: int, token: str | None
                   ) -> tuple[list[SecretInfo], str | None]: ...  # fmt: skip

    async def value(self, team_id: str, ref: str) -> str: ...

    async def count(self, team_id: str) -> int: ...


def page_token(info: SecretInfo) -> str:
    return base64.urlsafe_b64encode(f"{info.created_us}:{info.secret_id}".encode()).decode()


def parse_page_token(token: str | None) -> tuple[int, str]:
    """(created_us, secret_id) after which the page starts; SecretError."""
    if not token:
        return 0, ""
    try:
        us, _, sid = base64.urlsafe_b64decode(token.encode()).decode().partition(":")
        return int(us), sid
    except (ValueError, UnicodeDecodeError):
        raise SecretError("nextToken is not one this node gave") from None


def check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIMIT:
        raise SecretError(f"limit must be 1 to {MAX_LIMIT}")


def new_id() -> str:
    return ID_PREFIX + secrets.token_hex(10)


def check_new(name: object, value: object, metadata: object) -> tuple[str, bytes, dict[str, str]]:
    return check_name(name), check_value(value), check_metadata(metadata)


class SecretStore:
    def __init__(self, db: sqlite3.Connection, vault: Vault) -> None:
        """`db`: the node's database (orchestrator/store.py), autocommit, foreign keys on."""
        self._db = db
        scope_by_team(db, "secrets", _SCHEMA.split(";")[0])
        self._db.executescript(_SCHEMA)
        self._vault = vault

    async def create(self, team_id: str, name: object, value: object, metadata: object = None
                     ) -> SecretInfo:  # fmt: skip
        name, data, meta = check_new(name, value, metadata)
        sid = new_id()
        now = _now_us()
        try:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("INSERT INTO secrets VALUES (?, ?, 1, ?, ?, ?, ?)",
                                 (sid, name, json.dumps(meta), now, now, team_id))  # fmt: skip
                self._put_version(sid, 1, data)
        except sqlite3.IntegrityError:
            raise SecretExists(f"a secret named {name!r} exists") from None
        return await self.get(team_id, sid)

    async def update(self, team_id: str, ref: str, value: object, metadata: object = None
                     ) -> SecretInfo:  # fmt: skip
        """A new version (the current one from now on); `metadata`, if given, replaces."""
        data = check_value(value)
        meta = None if metadata is None else check_metadata(metadata)
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            info = await self.get(team_id, ref)
            version = info.version + 1
            self._put_version(info.secret_id, version, data)
            self._db.execute(
                "UPDATE secrets SET current_version=?, updated_us=?, "
                "metadata=COALESCE(?, metadata) WHERE secret_id=?",
                (version, _now_us(), None if meta is None else json.dumps(meta),
                 info.secret_id))  # fmt: skip
        return await self.get(team_id, info.secret_id)

    async def delete(self, team_id: str, ref: str) -> None:
        info = await self.get(team_id, ref)
        with self._db:
            self._db.execute("DELETE FROM secrets WHERE secret_id=?", (info.secret_id,))

    async def get(self, team_id: str, ref: str) -> SecretInfo:
        """The team's, by id or by name (names are matched lower-cased)."""
        row = self._db.execute(
            "SELECT secret_id, name, current_version, metadata, created_us, updated_us "
            "FROM secrets WHERE (secret_id=? OR name=?) AND team_id=?",
            (ref, ref.strip().lower(), team_id)).fetchone()  # fmt: skip
        if row is None:
            raise SecretNotFound(f"secret {ref!r} not found")
        return SecretInfo(row[0], row[1], row[2], json.loads(row[3]), row[4], row[5])

    async def page(self, team_id: str, limit: int, token: str | None
                   ) -> tuple[list[SecretInfo], str | None]:  # fmt: skip
        """The team's, oldest first; the token of the next page, None after the last."""
        check_limit(limit)
        after = parse_page_token(token)
        rows = self._db.execute(
            "SELECT secret_id FROM secrets WHERE team_id=? AND (created_us, secret_id) > (?, ?) "
            "ORDER BY created_us, secret_id LIMIT ?", (team_id, *after, limit + 1)).fetchall()
        items = [await self.get(team_id, r[0]) for r in rows[:limit]]
        return items, page_token(items[-1]) if len(rows) > limit else None

    async def count(self, team_id: str) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM secrets WHERE team_id=?",
                                    (team_id,)).fetchone()[0])  # fmt: skip

    async def value(self, team_id: str, ref: str) -> str:
        """The current version's value: for the egress proxy only, never for the API."""
        info = await self.get(team_id, ref)
        row = self._db.execute("SELECT sealed FROM secret_versions WHERE secret_id=? AND "
                               "version=?", (info.secret_id, info.version)).fetchone()  # fmt: skip
        assert row is not None
        return self._vault.open(row[0], f"{info.secret_id}/{info.version}").decode()

    def _put_version(self, sid: str, version: int, data: bytes) -> None:
        self._db.execute("INSERT INTO secret_versions VALUES (?, ?, ?)",
                         (sid, version, self._vault.seal(data, f"{sid}/{version}")))
