"""Keeping the step cache bounded and free of orphans. A build snapshot (`buildcache-…`) is
removed only when no step-cache entry and nothing in `in_use` (templates, builds starting
from it) refers to it; VMs restored from it keep their reflinked files."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable

from aenv.images.stepcache import CacheEntry, StepCache
from aenv.storage.snapshots import SnapshotNotFound, SnapshotStore

log = logging.getLogger(__name__)
PREFIX = "buildcache-"


def snapshot_bytes(store: SnapshotStore, snapshot_id: str) -> int:
    """Allocated bytes of a snapshot's files (an upper bound: extents may be shared)."""
    total = 0
    with contextlib.suppress(OSError):
        for f in os.scandir(store.path(snapshot_id)):
            with contextlib.suppress(OSError):
                total += f.stat(follow_symlinks=False).st_blocks * 512
    return total


def release(cache: StepCache, store: SnapshotStore, entries: Iterable[CacheEntry],
            in_use: set[str]) -> list[str]:
    """Remove the snapshots of dropped `entries` that nothing refers to any more."""
    keep = cache.referenced() | in_use
    gone = []
    for e in entries:
        if e.snapshot_id in keep or not e.snapshot_id.startswith(PREFIX):
            continue
        with contextlib.suppress(SnapshotNotFound):
            store.delete(e.snapshot_id)
            gone.append(e.snapshot_id)
    return gone


def sweep(cache: StepCache, store: SnapshotStore, in_use: set[str]) -> list[str]:
    """Remove build snapshots no entry refers to (start-up: no build is running)."""
    keep = cache.referenced() | in_use
    gone = []
    for sid in store.list():
        if sid.startswith(PREFIX) and sid not in keep:
            with contextlib.suppress(SnapshotNotFound):
                store.delete(sid)
                gone.append(sid)
    if gone:
        log.info("removed %d build snapshots no step-cache entry refers to", len(gone))
    return gone


def evict(cache: StepCache, store: SnapshotStore, bound: int, in_use: set[str]) -> list[str]:
    """Drop entries, least recently used first, until their snapshots fit in `bound`."""
    entries = cache.by_age()
    sizes = {e.snapshot_id: snapshot_bytes(store, e.snapshot_id) for _, e in entries}
    total = sum(sizes.values())
    dropped: list[str] = []
    for key, entry in entries:
        if total <= bound:
            break
        if entry.snapshot_id in in_use:
            continue
        cache.remove(key)
        dropped.append(key)
        if entry.snapshot_id not in cache.referenced():
            total -= sizes.pop(entry.snapshot_id, 0)
            with contextlib.suppress(SnapshotNotFound):
                store.delete(entry.snapshot_id)
    if dropped:
        log.info("step cache: dropped %d least recently used entries (bound %d MiB, now %d MiB)",
                 len(dropped), bound >> 20, total >> 20)  # fmt: skip
    return dropped
