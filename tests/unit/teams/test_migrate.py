"""A node's database from before teams: its tables get owners, and old rows are kept as the
default team's, with names unique per team from then on."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from aenv.teams.model import DEFAULT_TEAM
from aenv.volumes.store import VolumeExists, VolumeStore


async def test_an_old_volumes_table_is_rebuilt_with_its_rows(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "node.db", isolation_level=None)
    db.execute("PRAGMA foreign_keys=ON")
    db.execute("CREATE TABLE volumes (volume_id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, "
               "created_us INTEGER NOT NULL)")
    db.execute("INSERT INTO volumes VALUES ('vol_old', 'data', 1)")
    (tmp_path / "v" / "vol_old").mkdir(parents=True)
    store = VolumeStore(db, tmp_path / "v")
    old = await store.get("data", DEFAULT_TEAM)
    assert (old.volume_id, old.created_us) == ("vol_old", 1)
    with pytest.raises(VolumeExists):
        await store.create("data", DEFAULT_TEAM)
    other = await store.create("data", "blue")  # the same name in another team
    assert other.volume_id != "vol_old"
    assert [v.volume_id for v in await store.list(DEFAULT_TEAM)] == ["vol_old"]
    VolumeStore(db, tmp_path / "v")  # a second start leaves it as it is
    assert len(await store.list("blue")) == 1
    assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert db.execute("SELECT name FROM sqlite_master WHERE name LIKE '%with_teams'"
                      ).fetchall() == []  # fmt: skip
