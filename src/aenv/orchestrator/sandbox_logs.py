"""Each sandbox's log: what the node did to it, as E2B's sandbox logs show (docs/api.md).

Every `obs.log_event` that names a `sandbox_id` (created, paused, resumed, forked, snapshot,
timeout, killed, and the failures) is an entry: its time, level, event name as the message
and its other fields as strings. Events may be logged from worker threads, so they are
queued and written by the event loop (the store's connection is the loop's), in the
store's database, before every read and once a second. Entries outlive their sandbox by
`RETENTION_S` (a killed sandbox's log can still be read on its node), and at most
`MAX_PER_SANDBOX` are kept for one sandbox (the newest).

What the guest says (the template's start command's output, the agent's warnings:
guest/agent/journal.py) is pulled from the agent when the log is read while the sandbox
runs (`add_guest`), after the last entry taken (kept per sandbox, so nothing comes twice),
with `source` in its fields.
"""

from __future__ import annotations

import collections
import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

LEVELS = ("debug", "info", "warn", "error")
RETENTION_S = 24 * 3600
MAX_PER_SANDBOX = 10_000
_QUEUE = 100_000  # entries waiting for the loop: beyond it the oldest are dropped

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sandbox_logs (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    sandbox_id  TEXT NOT NULL,
    ts_us       INTEGER NOT NULL,
    level       INTEGER NOT NULL,
    message     TEXT NOT NULL,
    fields      TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sandbox_logs_by_sandbox ON sandbox_logs (sandbox_id, ts_us);
CREATE TABLE IF NOT EXISTS guest_log_cursors (
    sandbox_id  TEXT PRIMARY KEY,
    seq         INTEGER NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class LogEntry:
    ts_us: int
    level: str  # one of LEVELS
    message: str
    fields: dict[str, str]


def level_of(levelno: int) -> int:
    """A logging level as an index into LEVELS."""
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 2
    return 1 if levelno >= logging.INFO else 0


class SandboxLogs:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        db.executescript(_SCHEMA)
        self._queue: collections.deque[tuple[str, int, int, str, str]] = collections.deque(
            maxlen=_QUEUE)
        self._lock = threading.Lock()

    def capture(self, event: str, levelno: int, fields: dict[str, Any]) -> None:
        """`obs.log_event`'s sink: from any thread, cheap, never raises."""
        sid = fields.get("sandbox_id")
        if not isinstance(sid, str) or not sid:
            return
        rest = {k: v if isinstance(v, str) else json.dumps(v, default=str)
                for k, v in fields.items() if k != "sandbox_id"}  # fmt: skip
        with self._lock:
            self._queue.append((sid, time.time_ns() // 1000, level_of(levelno), event,
                                json.dumps(rest)))  # fmt: skip

    def flush(self) -> int:
        with self._lock:
            rows = list(self._queue)
            self._queue.clear()
        if rows:
            self.db.executemany("INSERT INTO sandbox_logs (sandbox_id, ts_us, level, message, "
                                "fields) VALUES (?, ?, ?, ?, ?)", rows)  # fmt: skip
        return len(rows)

    def guest_cursor(self, sandbox_id: str) -> int:
        """The number of the last guest journal entry taken into the log (0: none)."""
        row = self.db.execute("SELECT seq FROM guest_log_cursors WHERE sandbox_id = ?",
                              (sandbox_id,)).fetchone()  # fmt: skip
        return int(row[0]) if row else 0

    def add_guest(self, sandbox_id: str, entries: list[LogEntry], next_seq: int) -> int:
        """Guest journal entries into the log, with the cursor, in one transaction."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.executemany(
                "INSERT INTO sandbox_logs (sandbox_id, ts_us, level, message, fields) "
                "VALUES (?, ?, ?, ?, ?)",
                [(sandbox_id, e.ts_us, LEVELS.index(e.level), e.message, json.dumps(e.fields))
                 for e in entries])  # fmt: skip
            self.db.execute("INSERT INTO guest_log_cursors VALUES (?, ?) ON CONFLICT "
                            "(sandbox_id) DO UPDATE SET seq = excluded.seq",
                            (sandbox_id, next_seq))  # fmt: skip
        return len(entries)

    def prune(self, now_us: int) -> None:
        self.db.execute("DELETE FROM sandbox_logs WHERE ts_us < ?",
                        (now_us - RETENTION_S * 1_000_000,))  # fmt: skip
        # A cursor goes with the last entry of its sandbox's log.
        self.db.execute("DELETE FROM guest_log_cursors WHERE sandbox_id NOT IN "
                        "(SELECT sandbox_id FROM sandbox_logs)")
        self.db.execute(
            "DELETE FROM sandbox_logs WHERE seq IN (SELECT seq FROM (SELECT seq, ROW_NUMBER() "
            "OVER (PARTITION BY sandbox_id ORDER BY seq DESC) AS n FROM sandbox_logs) "
            "WHERE n > ?)", (MAX_PER_SANDBOX,))  # fmt: skip

    def has(self, sandbox_id: str) -> bool:
        self.flush()
        return self.db.execute("SELECT 1 FROM sandbox_logs WHERE sandbox_id = ? LIMIT 1",
                               (sandbox_id,)).fetchone() is not None  # fmt: skip

    def read(self, sandbox_id: str, *, cursor_us: int | None = None, limit: int = 1000,
             direction: Literal["forward", "backward"] = "forward", min_level: str = "debug",
             search: str | None = None) -> list[LogEntry]:  # fmt: skip
        """Forward: from `cursor_us` (default: the first) on, oldest first. Backward: up to
        `cursor_us` (default: now), newest first. `min_level` and above; `search`: a
        substring of the message or of a field's value, case-insensitive."""
        self.flush()
        forward = direction == "forward"
        sql = ["SELECT ts_us, level, message, fields FROM sandbox_logs WHERE sandbox_id = ?",
               "AND level >= ?"]  # fmt: skip
        args: list[Any] = [sandbox_id, LEVELS.index(min_level)]
        if cursor_us is not None:
            sql.append("AND ts_us >= ?" if forward else "AND ts_us <= ?")
            args.append(cursor_us)
        if search:
            sql.append("AND (instr(lower(message), ?) > 0 OR instr(lower(fields), ?) > 0)")
            args += [search.lower()] * 2
        sql.append(f"ORDER BY ts_us {'ASC' if forward else 'DESC'}, seq "
                   f"{'ASC' if forward else 'DESC'} LIMIT ?")  # fmt: skip
        args.append(limit)
        return [LogEntry(ts, LEVELS[lv], msg, json.loads(f))
                for ts, lv, msg, f in self.db.execute(" ".join(sql), args)]  # fmt: skip
