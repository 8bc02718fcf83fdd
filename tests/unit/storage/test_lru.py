"""The eviction order every bounded cache of the node shares (storage/lru.py)."""

from __future__ import annotations

from aenv.storage.lru import evictions


def test_least_recently_used_go_first_until_the_rest_fits_and_pinned_never_go() -> None:
    sizes = {"a": 10, "b": 10, "c": 10, "d": 10}
    used = {"a": 4.0, "b": 1.0, "c": 3.0, "d": 2.0}

    def size_of(keep: set[str]) -> int:
        return sum(sizes[k] for k in keep)

    assert evictions(sizes, used, set(), size_of, 40) == []
    assert evictions(sizes, used, set(), size_of, 25) == ["b", "d"]
    assert evictions(sizes, used, {"b"}, size_of, 25) == ["d", "c"]
    # Only pinned entries left over the bound: they stay.
    assert evictions(sizes, used, {"a", "b", "c", "d"}, size_of, 0) == []


def test_shared_bytes_count_once() -> None:
    blobs = {"x": {"l1", "l2"}, "y": {"l1"}, "z": {"l3"}}

    def size_of(keep: set[str]) -> int:
        return 10 * len(set().union(*(blobs[k] for k in keep)))

    # x and y share l1: dropping y alone frees nothing, so x goes after it.
    assert evictions(blobs, {"y": 1.0, "x": 2.0, "z": 3.0}, set(), size_of, 10) == ["y", "x"]
