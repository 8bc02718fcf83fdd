"""Keeping build contexts (images/context.py `ContextStore.evict`): bounded in all, least
recently used first, never one a build in flight copies or one just uploaded."""

from __future__ import annotations

import os
import time
from pathlib import Path

from aenv.images.context import KEEP_RECENT_S, ContextStore


def _put(store: ContextStore, n: int, size: int, age_s: float) -> str:
    h = f"{n:064x}"
    p = store.path(h)
    p.write_bytes(b"x" * size)
    when = time.time() - age_s
    os.utime(p, (when, when))
    return h


def test_least_recently_used_go_first_until_the_rest_fit(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "ctx", 1 << 20)
    old = KEEP_RECENT_S + 60
    a, b, c = (_put(store, i, 1000, old + 100 - i) for i in range(3))  # a is the oldest
    (tmp_path / "ctx" / ".tmp-upload").write_bytes(b"y" * 5000)  # an upload in progress
    assert store.present(a)  # asking for it is a use: a is now the newest
    assert store.evict(2000, set()) == [b]
    assert sorted(p.name for p in (tmp_path / "ctx").iterdir()) == sorted(
        [a, c, ".tmp-upload"])
    assert store.evict(2000, set()) == []  # fits now
    assert store.evict(0, set()) == [c]  # a was used just now: kept for KEEP_RECENT_S
    assert store.present(a) and not store.present(c)


def test_in_use_and_recent_uploads_are_kept_past_the_bound(tmp_path: Path) -> None:
    store = ContextStore(tmp_path / "ctx", 1 << 20)
    old = KEEP_RECENT_S + 60
    copying = _put(store, 1, 1000, old + 10)
    stale = _put(store, 2, 1000, old)
    fresh = _put(store, 3, 1000, 5)  # uploaded; its build may not have started
    assert store.evict(0, {copying}) == [stale]
    assert store.present(copying) and store.present(fresh)
    assert store.touch(stale) is False
