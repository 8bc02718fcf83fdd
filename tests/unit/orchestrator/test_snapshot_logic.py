"""Pure logic: snapshot pagination, names and references; space admission arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from aenv.config import MachineShape
from aenv.machines.api import SnapshotInfo, TemplateNotFound
from aenv.orchestrator import snapshots as snaps
from aenv.orchestrator import space
from aenv.orchestrator.errors import InvalidRequest


def snap(i: int, parent: str = "p", names: tuple[str, ...] = (), ts: str | None = None
         ) -> SnapshotInfo:
    return SnapshotInfo(
        snapshot_id=f"snap-{i:02d}", names=list(names), parent=parent, template="base",
        created_at=ts or f"2026-01-01T00:00:{i:02d}.000000Z", shape=MachineShape(),
    )  # fmt: skip


def test_page_is_newest_first_with_a_keyset_cursor() -> None:
    items = [snap(i) for i in range(7)] + [snap(20, parent="q")]
    seen: list[str] = []
    cursor = None
    while True:
        page, cursor = snaps.page(items, sandbox_id="p", limit=3, cursor=cursor)
        seen += [s.snapshot_id for s in page]
        if cursor is None:
            break
    assert seen == [f"snap-{i:02d}" for i in range(6, -1, -1)]
    # a page that ends exactly at the last item has no next cursor
    page, cursor = snaps.page(items, sandbox_id="p", limit=7)
    assert len(page) == 7 and cursor is None
    # equal timestamps: the id breaks the tie, and nothing is skipped or repeated
    same = [snap(i, ts="2026-01-01T00:00:00Z") for i in range(5)]
    p1, c1 = snaps.page(same, limit=2)
    p2, c2 = snaps.page(same, limit=2, cursor=c1)
    p3, c3 = snaps.page(same, limit=2, cursor=c2)
    assert [s.snapshot_id for s in p1 + p2 + p3] == [f"snap-{i:02d}" for i in (4, 3, 2, 1, 0)]
    assert c3 is None
    with pytest.raises(InvalidRequest):
        snaps.page(items, limit=0)
    with pytest.raises(InvalidRequest):
        snaps.page(items, limit=101)


def test_name_filter_matches_names_or_the_id() -> None:
    items = [snap(1, names=("a",)), snap(2, names=("a", "b")), snap(3)]
    assert [s.snapshot_id for s in snaps.page(items, name="a")[0]] == ["snap-02", "snap-01"]
    assert [s.snapshot_id for s in snaps.page(items, name="snap-03")[0]] == ["snap-03"]
    assert snaps.newest_named(items, "a").snapshot_id == "snap-02"
    with pytest.raises(TemplateNotFound):
        snaps.newest_named(items, "zzz")


def test_names_are_checked() -> None:
    assert snaps.check_name(None) == [] and snaps.check_name("") == []
    assert snaps.check_name("team/my-snap:v1") == ["team/my-snap:v1"]
    for bad in ("-x", "a b", "x" * 129, "é"):
        with pytest.raises(InvalidRequest):
            snaps.check_name(bad)
    assert snaps.new_snapshot_id() != snaps.new_snapshot_id()


def test_refs_defer_deletion_until_the_last_user() -> None:
    r = snaps.SnapshotRefs()
    assert r.doom("free") is True  # unused: delete now
    r.acquire("s")
    r.acquire("s")
    assert r.doom("s") is False and r.hidden("s")
    with pytest.raises(TemplateNotFound):
        r.acquire("s")
    assert r.release("s") is False
    assert r.release("s") is True and not r.hidden("s") and r.in_use("s") == 0
    r.acquire("t")
    assert r.release("t") is False  # never deleted


def test_space_arithmetic(tmp_path: Path) -> None:
    mib = space.MIB
    assert space.needed_bytes(1024, 512, 1024) == 2560 * mib
    assert space.shortfall(2560 * mib, 1024, 512, 1024) == 0
    assert space.shortfall(2560 * mib - 1, 1024, 512, 1024) == 1
    assert space.shortfall(0, 0, 0, 0) == 0
    with pytest.raises(ValueError):
        space.needed_bytes(-1, 0, 0)
    free = space.free_bytes(tmp_path)
    assert free > 0 and space.free_bytes(tmp_path / "not" / "yet") == pytest.approx(
        free, rel=0.01)
