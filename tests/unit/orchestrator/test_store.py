from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from aenv.orchestrator.states import SandboxState
from aenv.orchestrator.store import (
    SCHEMA_VERSION,
    ListQuery,
    MetricSample,
    SandboxRecord,
    Store,
    StoreError,
)
from aenv.secrets.sealing import Sealer

S = SandboxState
SEALER = Sealer.of_key(bytes(32))
ALL = frozenset({S.RUNNING, S.PAUSED})


def rec(sid: str, started: int, **kw: object) -> SandboxRecord:
    fields: dict[str, object] = dict(
        sandbox_id=sid, template_id="base", state=S.CREATING, started_at_us=started,
        end_at_us=started + 300_000_000, timeout_s=300, vcpus=1, memory_mib=512,
        disk_mib=4096, envd_version="0.6.4",
    )  # fmt: skip
    fields.update(kw)
    return SandboxRecord(**fields)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "aenv.db", SEALER)
    s.open()
    yield s
    s.close()


def running(store: Store, sid: str, started: int, **kw: object) -> SandboxRecord:
    r = rec(sid, started, **kw)
    store.insert(r)
    assert store.transition(sid, [S.CREATING], S.RUNNING, started, slot_addr="198.18.0.2")
    return r


def test_db_is_wal_private_and_versioned(store: Store) -> None:
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o600
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "aenv.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="schema version"):
        Store(path, SEALER).open()


def test_roundtrip_keeps_every_field(store: Store) -> None:
    r = rec("a" * 20, 1, metadata={"k": "v", "a b": "c&d"}, env_vars={"FOO": "bar"},
            access_token="tok", allow_internet=True, alias="base")  # fmt: skip
    store.insert(r)
    got = store.get(r.sandbox_id)
    assert got == r


def test_new_records_must_start_in_creating(store: Store) -> None:
    with pytest.raises(ValueError):
        store.insert(rec("x", 1, state=S.RUNNING))


def test_cas_succeeds_only_from_expected_state(store: Store) -> None:
    store.insert(rec("x", 1))
    assert not store.transition("x", [S.RUNNING], S.KILLING, 2)
    assert store.transition("x", [S.CREATING], S.RUNNING, 2, vmm_pid=42)
    assert store.get("x").state is S.RUNNING and store.get("x").vmm_pid == 42
    assert not store.transition("x", [S.CREATING], S.RUNNING, 3)


def test_cas_rejects_illegal_transitions(store: Store) -> None:
    store.insert(rec("x", 1))
    with pytest.raises(ValueError, match="illegal"):
        store.transition("x", [S.CREATING], S.PAUSED, 2)
    with pytest.raises(ValueError, match="illegal"):
        store.delete("x", [S.RUNNING])


def test_delete_cascades_metadata_and_metrics(store: Store) -> None:
    running(store, "x", 1, metadata={"k": "v"})
    assert store.add_metric("x", MetricSample(5, 1, 1.0, 1, 2, 0, 3, 4))
    assert store.transition("x", [S.RUNNING], S.KILLING, 2)
    assert store.delete("x", [S.KILLING])
    assert store.get("x") is None
    assert store.db.execute("SELECT COUNT(*) FROM sandbox_metadata").fetchone()[0] == 0
    assert store.metrics("x", 0, 10) == []
    assert not store.add_metric("x", MetricSample(6, 1, 1.0, 1, 2, 0, 3, 4))


def test_extend_end_never_shortens(store: Store) -> None:
    running(store, "x", 1)
    end = store.get("x").end_at_us
    assert store.extend_end("x", [S.RUNNING], end - 10, 2)
    assert store.get("x").end_at_us == end
    assert store.extend_end("x", [S.RUNNING], end + 10, 2)
    assert store.get("x").end_at_us == end + 10


def test_update_refuses_unknown_fields(store: Store) -> None:
    running(store, "x", 1)
    with pytest.raises(ValueError):
        store.update("x", [S.RUNNING], 2, access_token="other")


def test_list_orders_newest_first_and_paginates_without_overlap(store: Store) -> None:
    for i in range(7):
        running(store, f"s{i}", 1000 + i)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page, cursor = store.list(ListQuery(states=ALL, limit=3, cursor=cursor))
        seen += [r.sandbox_id for r in page]
        pages += 1
        if cursor is None:
            break
    assert seen == [f"s{i}" for i in reversed(range(7))]
    assert pages == 3


def test_list_last_full_page_has_no_cursor(store: Store) -> None:
    for i in range(4):
        running(store, f"s{i}", 1000 + i)
    page, cursor = store.list(ListQuery(states=ALL, limit=2, order="asc"))
    assert [r.sandbox_id for r in page] == ["s0", "s1"] and cursor is not None
    page, cursor = store.list(ListQuery(states=ALL, limit=2, order="asc", cursor=cursor))
    assert [r.sandbox_id for r in page] == ["s2", "s3"] and cursor is None


def test_list_ties_on_start_time_are_broken_by_id(store: Store) -> None:
    for sid in ("b", "a", "c"):
        running(store, sid, 1000)
    first, cur = store.list(ListQuery(states=ALL, limit=2, order="asc"))
    rest, _ = store.list(ListQuery(states=ALL, limit=2, order="asc", cursor=cur))
    assert [r.sandbox_id for r in first + rest] == ["a", "b", "c"]


def test_list_filters(store: Store) -> None:
    running(store, "a", 100, metadata={"suite": "1", "x": "y"})
    running(store, "b", 200, metadata={"suite": "1"})
    running(store, "c", 300, metadata={"suite": "2"}, template_id="other")
    store.insert(rec("creating", 400, metadata={"suite": "1"}))

    def ids(**kw: object) -> list[str]:
        return [r.sandbox_id for r in store.list(ListQuery(states=ALL, **kw))[0]]  # type: ignore[arg-type]

    assert ids(metadata={"suite": "1"}) == ["b", "a"]
    assert ids(metadata={"suite": "1", "x": "y"}) == ["a"]
    assert ids(metadata={"suite": "3"}) == []
    assert ids(started_after_us=200) == ["c", "b"]
    assert ids(started_after_us=201) == ["c"]
    assert ids(template="other") == ["c"]
    assert ids(template="nope") == []
    assert [r.sandbox_id for r in store.list(ListQuery(states=frozenset({S.PAUSED})))[0]] == []


def test_expired_and_counts(store: Store) -> None:
    running(store, "a", 0, end_at_us=10)
    running(store, "b", 0, end_at_us=1000)
    store.insert(rec("c", 0, end_at_us=5))
    assert store.expired(S.RUNNING, 100) == ["a"]
    assert store.count([S.RUNNING, S.CREATING]) == 3
    assert store.count_by_state() == {S.RUNNING: 2, S.CREATING: 1}


def test_metrics_window_and_prune(store: Store) -> None:
    running(store, "a", 0)
    for ts in (10, 20, 30):
        store.add_metric("a", MetricSample(ts, 1, 0.5, 1, 2, 3, 4, 5))
    assert [m.ts_us for m in store.metrics("a", 15, 30)] == [20, 30]
    assert store.last_metric_us("a") == 30
    assert store.prune_metrics(25) == 2
    assert [m.ts_us for m in store.metrics("a", 0, 100)] == [30]
