"""Step-cache housekeeping on a real snapshot store (plain directories of files)."""

from __future__ import annotations

import os
from pathlib import Path

from aenv.images import stepgc
from aenv.images.stepcache import CacheEntry, StepCache, StepState
from aenv.storage.snapshots import SnapshotStore


def _snap(store: SnapshotStore, sid: str, mib: int = 1) -> str:
    d = store.path(sid)
    d.mkdir(parents=True)
    (d / "memory").write_bytes(os.urandom(mib << 20))
    return sid


def _key(n: int) -> str:
    return f"{n:064x}"


def test_a_forced_rebuild_replaces_the_entry_and_drops_its_snapshot(tmp_path: Path) -> None:
    store, cache = SnapshotStore(tmp_path / "snapshots"), StepCache(tmp_path / "steps")
    old = CacheEntry(_snap(store, "buildcache-a"), StepState())
    assert cache.put(_key(1), old) is None
    new = CacheEntry(_snap(store, "buildcache-b"), StepState())
    replaced = cache.put(_key(1), new)
    assert replaced == old
    assert stepgc.release(cache, store, [replaced], set()) == ["buildcache-a"]
    assert store.list() == ["buildcache-b"]


def test_a_snapshot_two_entries_share_stays_until_both_go(tmp_path: Path) -> None:
    store, cache = SnapshotStore(tmp_path / "snapshots"), StepCache(tmp_path / "steps")
    shared = _snap(store, "buildcache-run")
    cache.put(_key(1), CacheEntry(shared, StepState()))
    cache.put(_key(2), CacheEntry(shared, StepState(env={"A": "1"})))  # an ENV after it
    cache.remove(_key(1))
    assert stepgc.release(cache, store, [CacheEntry(shared, StepState())], set()) == []
    assert stepgc.release(cache, store, [CacheEntry(shared, StepState())], {shared}) == []
    cache.remove(_key(2))
    assert stepgc.release(cache, store, [CacheEntry(shared, StepState())], set()) == [shared]


def test_sweep_removes_build_snapshots_no_entry_refers_to(tmp_path: Path) -> None:
    store, cache = SnapshotStore(tmp_path / "snapshots"), StepCache(tmp_path / "steps")
    cache.put(_key(1), CacheEntry(_snap(store, "buildcache-kept"), StepState()))
    _snap(store, "buildcache-orphan")
    _snap(store, "tpl-x")  # a template's: never the step cache's to remove
    _snap(store, "buildcache-template")  # in use (say a template made from it)
    assert stepgc.sweep(cache, store, {"buildcache-template"}) == ["buildcache-orphan"]
    assert store.list() == ["buildcache-kept", "buildcache-template", "tpl-x"]


def test_evict_drops_the_least_recently_used_until_it_fits(tmp_path: Path) -> None:
    store, cache = SnapshotStore(tmp_path / "snapshots"), StepCache(tmp_path / "steps")
    for n in range(4):
        cache.put(_key(n), CacheEntry(_snap(store, f"buildcache-{n}"), StepState()))
        os.utime(cache.root / f"{_key(n)}.json", (1000 + n, 1000 + n))
    assert cache.get(_key(0), touch=True) is not None  # used now: the newest
    dropped = stepgc.evict(cache, store, (3 << 20) + 4096, {"buildcache-1"})
    assert dropped == [_key(2)]  # 1 is in use (skipped), then 2 is the oldest
    assert store.list() == ["buildcache-0", "buildcache-1", "buildcache-3"]
    assert stepgc.evict(cache, store, 1 << 40, set()) == []
