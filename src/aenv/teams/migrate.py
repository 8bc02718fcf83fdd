"""Tables made before teams, given an owner: every old row is the default team's, and a
name that was unique on the node becomes unique within its team."""

from __future__ import annotations

import sqlite3

from aenv.teams.model import DEFAULT_TEAM


def scope_by_team(db: sqlite3.Connection, table: str, create: str) -> None:
    """Rebuild `table` by `create` (its new CREATE TABLE, with `team_id`) if it lacks the
    column: SQLite cannot change a UNIQUE constraint in place. The copy is made under a new
    name and swapped in, with foreign keys off, so rows that reference it are kept."""
    cols = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
    if not cols or "team_id" in cols:
        return
    new = f"{table}_with_teams"
    db.execute("PRAGMA foreign_keys=OFF")  # no effect inside a transaction: before it
    try:
        with db:
            db.execute("BEGIN IMMEDIATE")
            db.execute(create.replace(f"CREATE TABLE IF NOT EXISTS {table} ",
                                      f"CREATE TABLE {new} ", 1))  # fmt: skip
            names = ", ".join(cols)
            db.execute(f"INSERT INTO {new} ({names}, team_id) SELECT {names}, ? FROM {table}",
                       (DEFAULT_TEAM,))  # fmt: skip
            db.execute(f"DROP TABLE {table}")
            db.execute(f"ALTER TABLE {new} RENAME TO {table}")
    finally:
        db.execute("PRAGMA foreign_keys=ON")
