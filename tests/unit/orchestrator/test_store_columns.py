"""Columns added after the first release: a database created before them still opens, its
rows read with the defaults, and the new fields are stored and updated."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from aenv.orchestrator.states import SandboxState
from aenv.orchestrator.store import _SCHEMA, SCHEMA_VERSION, SandboxRecord, Store
from aenv.secrets.sealing import Sealer

SEALER = Sealer.of_key(bytes(32))

S = SandboxState
OLD_COLUMNS = (
    "sandbox_id, template_id, state, started_at_us, end_at_us, timeout_s, vcpus, memory_mib, "
    "disk_mib, envd_version, auto_pause, updated_at_us"
)


def _old_db(path: Path) -> None:
    """The first release's database: `_SCHEMA` without the added columns, one paused row."""
    db = sqlite3.connect(path)
    db.executescript(_SCHEMA)
    assert "pause_mode" not in {r[1] for r in db.execute("PRAGMA table_info(sandboxes)")}
    db.execute(f"INSERT INTO sandboxes ({OLD_COLUMNS}) VALUES "
               "('old', 'base', 'paused', 1, 2, 300, 1, 512, 4096, '0.6.4', 1, 3)")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()


def test_an_old_database_gains_the_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "aenv.db"
    _old_db(path)
    store = Store(path, SEALER)
    store.open()
    try:
        old = store.get("old")
        assert old is not None and old.state is S.PAUSED
        assert old.auto_pause_memory is True and old.pause_mode is None
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        new = SandboxRecord(sandbox_id="new", template_id="base", state=S.CREATING,
                            started_at_us=5, end_at_us=6, timeout_s=1, vcpus=1,
                            memory_mib=512, disk_mib=4096, envd_version="0.6.4",
                            auto_pause=True, auto_pause_memory=False)  # fmt: skip
        store.insert(new)
        assert store.transition("new", [S.CREATING], S.RUNNING, 7)
        assert store.transition("new", [S.RUNNING], S.PAUSING, 8, pause_mode="filesystem")
        got = store.get("new")
        assert got is not None and got.auto_pause_memory is False
        assert got.pause_mode == "filesystem"
    finally:
        store.close()
    # opening again changes nothing
    store.open()
    try:
        assert {r.sandbox_id for r in store.all()} == {"old", "new"}
    finally:
        store.close()
