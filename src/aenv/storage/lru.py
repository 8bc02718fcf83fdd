"""A bounded cache's eviction order, one rule for every cache of the node (the image cache,
the fetched-snapshot cache): least recently used first, never a pinned entry, until what
is kept fits the bound. Sizes come from the cache (`size_of` the entries it would keep),
so entries that share bytes (images sharing layers) are counted once.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping


def evictions(entries: Collection[str], last_used: Mapping[str, float], pinned: Collection[str],
              size_of: Callable[[set[str]], int], bound: int) -> list[str]:  # fmt: skip
    """The entries to remove, in order, so that the rest fit in `bound` (or only the pinned
    and those that cannot go are left)."""
    keep = set(entries)
    out: list[str] = []
    total = size_of(keep)
    for name in sorted((e for e in entries if e not in pinned),
                       key=lambda e: (last_used.get(e, 0.0), e)):  # fmt: skip
        if total <= bound:
            break
        keep.discard(name)
        out.append(name)
        total = size_of(keep)
    return out
