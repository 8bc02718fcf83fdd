"""SQLite (WAL) persistence for sandbox records and their metric samples.

One connection, used from the event loop thread only: every statement is a short indexed
read or write (sub-millisecond), so running them inline is cheaper than a thread hop and
keeps the compare-and-set semantics trivially atomic. State changes go only through
`transition`/`delete`, which compare-and-set in SQL and check `states.TRANSITIONS`.

Times are integer microseconds since the Unix epoch (UTC), so ordering and `startedAfter`
comparisons keep full precision.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aenv.network.egress import EgressPolicy
from aenv.orchestrator.routes import Ingress
from aenv.orchestrator.states import GONE, SandboxState, is_legal
from aenv.secrets.sealing import Sealer, is_sealed
from aenv.teams.model import DEFAULT_TEAM

# Schema version of the records on disk: a reader refuses a newer major. Columns added
# later are in `_ADDED_COLUMNS`, added in place to a database that lacks them (older readers
# name the columns they read, so the version stays).
SCHEMA_VERSION = 1
ENDED_KEPT_S = 24 * 3600  # as long as an ended sandbox's log (sandbox_logs.RETENTION_S)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    sandbox_id      TEXT PRIMARY KEY,
    template_id     TEXT NOT NULL,
    alias           TEXT,
    state           TEXT NOT NULL,
    metadata        TEXT NOT NULL DEFAULT '{}',
    env_vars        TEXT NOT NULL DEFAULT '{}',
    access_token    TEXT,
    started_at_us   INTEGER NOT NULL,
    end_at_us       INTEGER NOT NULL,
    timeout_s       INTEGER NOT NULL,
    vcpus           INTEGER NOT NULL,
    memory_mib      INTEGER NOT NULL,
    disk_mib        INTEGER NOT NULL,
    envd_version    TEXT NOT NULL,
    auto_pause      INTEGER NOT NULL DEFAULT 0,
    auto_resume     INTEGER NOT NULL DEFAULT 0,
    allow_internet  INTEGER,
    slot_addr       TEXT,
    vmm_pid         INTEGER,
    updated_at_us   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS sandboxes_by_start ON sandboxes (started_at_us, sandbox_id);
CREATE INDEX IF NOT EXISTS sandboxes_by_state_end ON sandboxes (state, end_at_us);
-- Who owned a sandbox that ended, for as long as its log is kept (sandbox_logs.py): its
-- log stays its team's alone.
CREATE TABLE IF NOT EXISTS ended_sandboxes (
    sandbox_id  TEXT PRIMARY KEY,
    team_id     TEXT NOT NULL,
    ended_us    INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sandbox_metadata (
    sandbox_id  TEXT NOT NULL REFERENCES sandboxes (sandbox_id) ON DELETE CASCADE,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,
    PRIMARY KEY (sandbox_id, key)
);
CREATE INDEX IF NOT EXISTS sandbox_metadata_by_kv ON sandbox_metadata (key, value);
CREATE TABLE IF NOT EXISTS sandbox_metrics (
    sandbox_id    TEXT NOT NULL REFERENCES sandboxes (sandbox_id) ON DELETE CASCADE,
    ts_us         INTEGER NOT NULL,
    cpu_count     INTEGER NOT NULL,
    cpu_used_pct  REAL NOT NULL,
    mem_used      INTEGER NOT NULL,
    mem_total     INTEGER NOT NULL,
    mem_cache     INTEGER NOT NULL,
    disk_used     INTEGER NOT NULL,
    disk_total    INTEGER NOT NULL,
    PRIMARY KEY (sandbox_id, ts_us)
);
"""

# Added after the first release: name -> column definition (with the default old rows get).
_ADDED_COLUMNS = {
    "auto_pause_memory": "INTEGER NOT NULL DEFAULT 1",  # 0: the TTL auto-pause is fs-only
    "pause_mode": "TEXT",  # "full" or "filesystem" from the pause on (None: never paused)
    "egress": "TEXT",  # EgressPolicy as JSON; NULL: no egress (the default)
    "default_user": "TEXT",  # from the template's image (USER); NULL: "user"
    "default_workdir": "TEXT",  # from the template's image (WORKDIR); NULL: the user's home
    "ingress": "TEXT",  # routes.Ingress as JSON; NULL: public ports, no mask, no HTTPS
    "volume_mounts": "TEXT",  # [{"name", "path", "id"}] as JSON; NULL: none
    "team_id": "TEXT",  # its owner (teams/); NULL: the default team (made before teams)
    "forked_from": "TEXT",  # a fork child's parent sandbox, or the snapshot it came from
}
_COLUMNS = (
    "sandbox_id", "template_id", "alias", "state", "metadata", "env_vars", "access_token",
    "started_at_us", "end_at_us", "timeout_s", "vcpus", "memory_mib", "disk_mib", "envd_version",
    "auto_pause", "auto_resume", "allow_internet", "slot_addr", "vmm_pid", "updated_at_us",
    *_ADDED_COLUMNS,
)  # fmt: skip
# What grants access to a sandbox or through it: sealed on disk (secrets/sealing.py).
SEALED_COLUMNS = ("env_vars", "access_token", "egress", "ingress")
_MUTABLE = frozenset({
    "end_at_us", "timeout_s", "slot_addr", "vmm_pid", "started_at_us", "auto_pause",
    "pause_mode",
})  # fmt: skip


class StoreError(Exception):
    """The database is unusable (newer schema, corrupt file)."""


@dataclass
class SandboxRecord:
    """One sandbox as persisted. Valid in every state; `slot_addr`/`vmm_pid` only with a VM."""

    sandbox_id: str
    template_id: str
    state: SandboxState
    started_at_us: int
    end_at_us: int
    timeout_s: int
    vcpus: int
    memory_mib: int
    disk_mib: int
    envd_version: str
    alias: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    access_token: str | None = None
    auto_pause: bool = False
    auto_resume: bool = False
    allow_internet: bool | None = None
    slot_addr: str | None = None
    vmm_pid: int | None = None
    updated_at_us: int = 0
    auto_pause_memory: bool = True
    pause_mode: Literal["full", "filesystem"] | None = None
    egress: EgressPolicy = field(default_factory=EgressPolicy)  # applied on every start
    default_user: str | None = None
    default_workdir: str | None = None
    ingress: Ingress = field(default_factory=Ingress)
    # (volume name, mount path, volume id), mounted at every start (create, resume, fork).
    volume_mounts: list[tuple[str, str, str]] = field(default_factory=list)
    team_id: str = DEFAULT_TEAM
    forked_from: str | None = None  # its lineage (the console shows it)

    def _row(self, sealer: Sealer) -> tuple[Any, ...]:
        d = self.__dict__ | {
            "state": str(self.state),
            "metadata": json.dumps(self.metadata),
            "env_vars": json.dumps(self.env_vars),
            "auto_pause": int(self.auto_pause),
            "auto_resume": int(self.auto_resume),
            "auto_pause_memory": int(self.auto_pause_memory),
            "allow_internet": None if self.allow_internet is None else int(self.allow_internet),
            "egress": _egress_column(self.egress),
            "ingress": None if self.ingress == Ingress() else json.dumps(self.ingress.to_json()),
            "volume_mounts": json.dumps([{"name": n, "path": p, "id": i}
                                         for n, p, i in self.volume_mounts])
            if self.volume_mounts else None,
        }
        for c in SEALED_COLUMNS:
            if d[c] is not None:
                d[c] = sealer.seal(d[c], f"{self.sandbox_id}/{c}")
        return tuple(d[c] for c in _COLUMNS)

    @classmethod
    def _from_row(cls, row: sqlite3.Row, sealer: Sealer) -> SandboxRecord:
        d = dict(zip(_COLUMNS, row, strict=True))
        for c in SEALED_COLUMNS:
            if d[c] is not None:
                d[c] = sealer.open(d[c], f"{d['sandbox_id']}/{c}")
        d["state"] = SandboxState(d["state"])
        d["metadata"] = json.loads(d["metadata"])
        d["env_vars"] = json.loads(d["env_vars"])
        d["auto_pause"] = bool(d["auto_pause"])
        d["auto_resume"] = bool(d["auto_resume"])
        d["auto_pause_memory"] = bool(d["auto_pause_memory"])
        if d["allow_internet"] is not None:
            d["allow_internet"] = bool(d["allow_internet"])
        d["egress"] = (EgressPolicy() if d["egress"] is None
                       else EgressPolicy.from_json(json.loads(d["egress"])))
        d["ingress"] = (Ingress() if d["ingress"] is None
                        else Ingress.from_json(json.loads(d["ingress"])))
        d["team_id"] = d["team_id"] or DEFAULT_TEAM
        mounts = json.loads(d["volume_mounts"] or "[]")
        d["volume_mounts"] = [(m["name"], m["path"], m["id"]) for m in mounts]
        return cls(**d)


def _egress_column(egress: EgressPolicy) -> str | None:
    return None if egress == EgressPolicy() else json.dumps(egress.to_json())


@dataclass(frozen=True)
class MetricSample:
    ts_us: int
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int


@dataclass(frozen=True)
class ListQuery:
    """A page of `GET /v2/sandboxes`: filters, order and a keyset cursor."""

    states: frozenset[SandboxState]
    metadata: dict[str, str] = field(default_factory=dict)
    started_after_us: int | None = None
    template: str | None = None
    order: Literal["asc", "desc"] = "desc"
    limit: int = 100
    cursor: tuple[int, str] | None = None  # (started_at_us, sandbox_id) of the last row seen
    team_id: str | None = None  # only this team's (None: every team's)


class Store:
    def __init__(self, path: Path, sealer: Sealer) -> None:
        self.path = path
        self.sealer = sealer
        self._db: sqlite3.Connection | None = None
        # Called after a record is added, changes state or goes (the cluster's bindings
        # follow at once, not at their next round). Must be cheap and not raise.
        self.on_change: list[Callable[[], None]] = []

    def _changed(self) -> None:
        for f in self.on_change:
            f()

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists()
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        if fresh:
            os.chmod(self.path, 0o600)  # holds access tokens and env vars
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        db.execute("PRAGMA busy_timeout=5000")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            db.close()
            raise StoreError(
                f"{self.path} has schema version {version}; this aenv reads up to "
                f"{SCHEMA_VERSION}"
            )
        db.executescript(_SCHEMA)
        have = {row[1] for row in db.execute("PRAGMA table_info(sandboxes)")}
        for name, definition in _ADDED_COLUMNS.items():
            if name not in have:
                db.execute(f"ALTER TABLE sandboxes ADD COLUMN {name} {definition}")
        db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._db = db
        self._reseal()

    def _reseal(self) -> None:
        """Seal what a database written before sealing holds in the clear."""
        cols = ", ".join(SEALED_COLUMNS)
        for sid, *vals in self.db.execute(f"SELECT sandbox_id, {cols} FROM sandboxes"):
            if all(v is None or is_sealed(v) for v in vals):
                continue
            new = [v if v is None or is_sealed(v) else self.sealer.seal(v, f"{sid}/{c}")
                   for c, v in zip(SEALED_COLUMNS, vals, strict=True)]  # fmt: skip
            self.db.execute(f"UPDATE sandboxes SET {', '.join(f'{c} = ?' for c in SEALED_COLUMNS)}"
                            " WHERE sandbox_id = ?", (*new, sid))  # fmt: skip

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def is_open(self) -> bool:
        return self._db is not None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            raise StoreError("store is not open")
        return self._db

    # -- records ---------------------------------------------------------------------------

    def insert(self, rec: SandboxRecord, *, taken_over: bool = False) -> None:
        """A new sandbox, in Creating; or (`taken_over`) a paused sandbox another node
        published, whose paused state this node now holds, in Paused."""
        start = SandboxState.PAUSED if taken_over else SandboxState.CREATING
        if rec.state is not start:
            raise ValueError(f"a new record starts in {start}")
        cols = ", ".join(_COLUMNS)
        marks = ", ".join("?" * len(_COLUMNS))
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute(f"INSERT INTO sandboxes ({cols}) VALUES ({marks})",
                            rec._row(self.sealer))
            self.db.executemany(
                "INSERT INTO sandbox_metadata (sandbox_id, key, value) VALUES (?, ?, ?)",
                [(rec.sandbox_id, k, v) for k, v in rec.metadata.items()],
            )
        self._changed()

    def get(self, sandbox_id: str) -> SandboxRecord | None:
        row = self.db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM sandboxes WHERE sandbox_id = ?", (sandbox_id,)
        ).fetchone()
        return SandboxRecord._from_row(row, self.sealer) if row else None

    def all(self) -> list[SandboxRecord]:
        rows = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM sandboxes").fetchall()
        return [SandboxRecord._from_row(r, self.sealer) for r in rows]

    def transition(
        self,
        sandbox_id: str,
        expected: Iterable[SandboxState],
        new: SandboxState,
        now_us: int,
        **fields: Any,
    ) -> bool:
        """Compare-and-set the state (plus `fields`); False if the state was not `expected`."""
        expected = tuple(expected)
        for src in expected:
            if not is_legal(src, new):
                raise ValueError(f"illegal transition {src} -> {new}")
        done = self._update(sandbox_id, expected, {"state": str(new), **fields}, now_us)
        if done:
            self._changed()
        return done

    def update(
        self, sandbox_id: str, expected: Iterable[SandboxState], now_us: int, **fields: Any
    ) -> bool:
        """Change fields (not the state) if the state is one of `expected`."""
        return self._update(sandbox_id, tuple(expected), fields, now_us)

    def _update(
        self, sandbox_id: str, expected: tuple[SandboxState, ...], fields: dict[str, Any],
        now_us: int,
    ) -> bool:
        bad = set(fields) - _MUTABLE - {"state"}
        if bad:
            raise ValueError(f"fields not updatable: {sorted(bad)}")
        sets = ", ".join(f"{k} = ?" for k in fields)
        marks = ", ".join("?" * len(expected))
        cur = self.db.execute(
            f"UPDATE sandboxes SET {sets}, updated_at_us = ? "
            f"WHERE sandbox_id = ? AND state IN ({marks})",
            (*fields.values(), now_us, sandbox_id, *map(str, expected)),
        )
        return cur.rowcount == 1

    def set_egress(self, sandbox_id: str, expected: Iterable[SandboxState], egress: EgressPolicy,
                   allow_internet: bool | None, now_us: int) -> bool:  # fmt: skip
        """A live network update: the policy and the request's allowInternetAccess."""
        expected = tuple(expected)
        marks = ", ".join("?" * len(expected))
        cur = self.db.execute(
            f"UPDATE sandboxes SET egress = ?, allow_internet = ?, updated_at_us = ? "
            f"WHERE sandbox_id = ? AND state IN ({marks})",
            (self._sealed_egress(sandbox_id, egress),
             None if allow_internet is None else int(allow_internet),
             now_us, sandbox_id, *map(str, expected)),
        )
        return cur.rowcount == 1

    def _sealed_egress(self, sandbox_id: str, egress: EgressPolicy) -> str | None:
        column = _egress_column(egress)
        return None if column is None else self.sealer.seal(column, f"{sandbox_id}/egress")

    def extend_end(
        self, sandbox_id: str, expected: Iterable[SandboxState], end_at_us: int, now_us: int
    ) -> bool:
        """endAt = max(endAt, end_at_us): the extend-only TTL of connect and refreshes."""
        expected = tuple(expected)
        marks = ", ".join("?" * len(expected))
        cur = self.db.execute(
            f"UPDATE sandboxes SET end_at_us = MAX(end_at_us, ?), updated_at_us = ? "
            f"WHERE sandbox_id = ? AND state IN ({marks})",
            (end_at_us, now_us, sandbox_id, *map(str, expected)),
        )
        return cur.rowcount == 1

    def delete(self, sandbox_id: str, expected: Iterable[SandboxState]) -> bool:
        """Remove the record (and its metadata and metrics) if its state is `expected`."""
        expected = tuple(expected)
        for src in expected:
            if not is_legal(src, GONE):
                raise ValueError(f"illegal removal from {src}")
        marks = ", ".join("?" * len(expected))
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            row = self.db.execute(
                f"DELETE FROM sandboxes WHERE sandbox_id = ? AND state IN ({marks}) "
                "RETURNING team_id", (sandbox_id, *map(str, expected)),
            ).fetchone()
            if row is not None:
                now = time.time_ns() // 1000
                self.db.execute("INSERT OR REPLACE INTO ended_sandboxes VALUES (?, ?, ?)",
                                (sandbox_id, row[0], now))  # fmt: skip
                self.db.execute("DELETE FROM ended_sandboxes WHERE ended_us < ?",
                                (now - ENDED_KEPT_S * 1_000_000,))  # fmt: skip
        if row is not None:
            self._changed()
        return row is not None

    def ended_team(self, sandbox_id: str) -> str | None:
        """The team of a sandbox that ended here (within ENDED_KEPT_S), else None."""
        row = self.db.execute("SELECT team_id FROM ended_sandboxes WHERE sandbox_id = ?",
                              (sandbox_id,)).fetchone()  # fmt: skip
        return None if row is None else str(row[0])

    def force_delete(self, sandbox_id: str) -> None:
        """Remove a record whatever its state: restart recovery and shutdown only."""
        self.db.execute("DELETE FROM sandboxes WHERE sandbox_id = ?", (sandbox_id,))
        self._changed()

    def force_state(self, sandbox_id: str, state: SandboxState, now_us: int) -> None:
        """Set a state without CAS: restart recovery only (no other writer exists then)."""
        self.db.execute(
            "UPDATE sandboxes SET state = ?, updated_at_us = ? WHERE sandbox_id = ?",
            (str(state), now_us, sandbox_id),
        )
        self._changed()

    def count(self, states: Iterable[SandboxState], team_id: str | None = None) -> int:
        """Sandboxes in `states` (of one team, if given)."""
        return self._aggregate("COUNT(*)", states, team_id)

    def sum_memory_mib(self, states: Iterable[SandboxState], team_id: str | None = None) -> int:
        """Guest RAM of the sandboxes in `states` (of one team, if given)."""
        return self._aggregate("COALESCE(SUM(memory_mib), 0)", states, team_id)

    def _aggregate(self, what: str, states: Iterable[SandboxState], team_id: str | None) -> int:
        states = tuple(states)
        sql = f"SELECT {what} FROM sandboxes WHERE state IN ({', '.join('?' * len(states))})"
        args: list[Any] = [str(s) for s in states]
        if team_id is not None:
            sql += " AND COALESCE(team_id, ?) = ?"
            args += [DEFAULT_TEAM, team_id]
        return int(self.db.execute(sql, args).fetchone()[0])

    def count_by_state(self) -> dict[SandboxState, int]:
        rows = self.db.execute("SELECT state, COUNT(*) FROM sandboxes GROUP BY state").fetchall()
        return {SandboxState(s): n for s, n in rows}

    def expired(self, state: SandboxState, now_us: int) -> list[str]:
        rows = self.db.execute(
            "SELECT sandbox_id FROM sandboxes WHERE state = ? AND end_at_us <= ?",
            (str(state), now_us),
        ).fetchall()
        return [r[0] for r in rows]

    def forks_of(self, parent: str) -> list[str]:
        """The live sandboxes forked from `parent` (a sandbox or a snapshot)."""
        rows = self.db.execute("SELECT sandbox_id FROM sandboxes WHERE forked_from = ? "
                               "ORDER BY started_at_us", (parent,)).fetchall()  # fmt: skip
        return [r[0] for r in rows]

    def briefly(self) -> list[tuple[str, str, SandboxState, int]]:
        """Every sandbox's id, team, state and guest RAM (MiB): no sealed field opened."""
        rows = self.db.execute("SELECT sandbox_id, COALESCE(team_id, ?), state, memory_mib "
                               "FROM sandboxes", (DEFAULT_TEAM,)).fetchall()  # fmt: skip
        return [(sid, team, SandboxState(state), mib) for sid, team, state, mib in rows]

    def with_state(self, states: Iterable[SandboxState]) -> list[SandboxRecord]:
        states = tuple(states)
        marks = ", ".join("?" * len(states))
        rows = self.db.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM sandboxes WHERE state IN ({marks})",
            tuple(map(str, states)),
        ).fetchall()
        return [SandboxRecord._from_row(r, self.sealer) for r in rows]

    def list(self, q: ListQuery) -> tuple[list[SandboxRecord], tuple[int, str] | None]:
        """One page and the cursor of the next one (None on the last page)."""
        if not q.states:
            return [], None
        where = [f"state IN ({', '.join('?' * len(q.states))})"]
        args: list[Any] = sorted(map(str, q.states))
        for k, v in q.metadata.items():
            where.append(
                "EXISTS (SELECT 1 FROM sandbox_metadata m WHERE m.sandbox_id = s.sandbox_id "
                "AND m.key = ? AND m.value = ?)"
            )
            args += [k, v]
        if q.started_after_us is not None:
            where.append("started_at_us >= ?")
            args.append(q.started_after_us)
        if q.team_id is not None:
            where.append("COALESCE(team_id, ?) = ?")
            args += [DEFAULT_TEAM, q.team_id]
        if q.template is not None:
            where.append("(template_id = ? OR alias = ?)")
            args += [q.template, q.template]
        cmp, direction = ("<", "DESC") if q.order == "desc" else (">", "ASC")
        if q.cursor is not None:
            where.append(f"(started_at_us, sandbox_id) {cmp} (?, ?)")
            args += list(q.cursor)
        sql = (
            f"SELECT {', '.join(_COLUMNS)} FROM sandboxes s WHERE {' AND '.join(where)} "
            f"ORDER BY started_at_us {direction}, sandbox_id {direction} LIMIT ?"
        )
        rows = self.db.execute(sql, (*args, q.limit + 1)).fetchall()
        recs = [SandboxRecord._from_row(r, self.sealer) for r in rows[: q.limit]]
        more = len(rows) > q.limit
        nxt = (recs[-1].started_at_us, recs[-1].sandbox_id) if more and recs else None
        return recs, nxt

    # -- metrics ---------------------------------------------------------------------------

    def add_metric(self, sandbox_id: str, m: MetricSample) -> bool:
        """Store one sample; False if the sandbox record is gone (killed meanwhile)."""
        try:
            self.db.execute(
                "INSERT OR REPLACE INTO sandbox_metrics VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (sandbox_id, m.ts_us, m.cpu_count, m.cpu_used_pct, m.mem_used, m.mem_total,
                 m.mem_cache, m.disk_used, m.disk_total),
            )  # fmt: skip
        except sqlite3.IntegrityError:
            return False
        return True

    def metrics(self, sandbox_id: str, start_us: int, end_us: int) -> list[MetricSample]:
        rows = self.db.execute(
            "SELECT ts_us, cpu_count, cpu_used_pct, mem_used, mem_total, mem_cache, disk_used, "
            "disk_total FROM sandbox_metrics WHERE sandbox_id = ? AND ts_us BETWEEN ? AND ? "
            "ORDER BY ts_us",
            (sandbox_id, start_us, end_us),
        ).fetchall()
        return [MetricSample(*r) for r in rows]

    def last_metric_us(self, sandbox_id: str) -> int | None:
        row = self.db.execute(
            "SELECT MAX(ts_us) FROM sandbox_metrics WHERE sandbox_id = ?", (sandbox_id,)
        ).fetchone()
        return row[0]

    def prune_metrics(self, before_us: int) -> int:
        return self.db.execute("DELETE FROM sandbox_metrics WHERE ts_us < ?", (before_us,)).rowcount
