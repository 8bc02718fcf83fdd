"""The image cache's bound (`image_cache_bytes`): blobs of images no template needs go,
least recently used first, until the cache fits. An image a template was made from is
pinned (a rebuild needs no pull); nothing else needs a blob once its template's disk is made,
so no sandbox, snapshot or template ever breaks when its image goes. When pinned images
alone exceed the bound, the cache says so (a log line, the `aenv_image_cache_bytes` gauge),
and a pull that would not fit beside them is refused before it writes anything (507).
Removal is umoci's: untag the image, then collect the blobs no tag references.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge

from aenv.images.cache import ImageCache, NoSpace, umoci
from aenv.images.registry import RemoteImage
from aenv.storage import lru
from aenv.storage.files import write_json_atomic

log = logging.getLogger(__name__)
CACHE_BYTES = Gauge("aenv_image_cache_bytes", "Image cache blob bytes", ["kind"])
EVICTIONS = Counter("aenv_image_cache_evictions_total", "Images evicted from the image cache")
USAGE = "usage.json"


@dataclass
class Report:
    total: int
    pinned: int
    evicted: list[str] = field(default_factory=list)


def _usage(cache: ImageCache) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads((cache.root / USAGE).read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def touch(cache: ImageCache, tag: str) -> None:
    """`tag` was just used (pulled, or found cached)."""
    usage = _usage(cache)
    usage[tag] = time.time()
    write_json_atomic(cache.root / USAGE, usage)


def _size(cache: ImageCache, blobs: set[str]) -> int:
    total = 0
    for d in blobs:
        p = cache.blob_path(d)
        if p.exists():
            total += p.stat().st_blocks * 512
    return total


def _cached(cache: ImageCache) -> tuple[dict[str, set[str]], set[str]]:
    """The cache's images (by tag) and the blobs of the node-local ones (images.local), which
    are outside the bound: the node made them, no registry has them, they are never evicted
    and not counted."""
    tags, local = cache.tags(), cache.local.tags()
    own = set().union(*(tags[t] for t in local if t in tags))
    return {t: b for t, b in tags.items() if t not in local}, own


def check_room(cache: ImageCache, remote: RemoteImage, bound: int, pinned: set[str]) -> None:
    """NoSpace (507) when the image would not fit in the bound beside the pinned images."""
    tags, own = _cached(cache)
    pinned_blobs = set().union(*(tags[t] for t in pinned if t in tags)) - own
    have = cache.cached_blobs()
    new = sum(layer.size for layer in remote.layers if layer.digest not in have)
    if _size(cache, pinned_blobs) + new > bound:
        raise NoSpace(f"{remote.reference} ({new >> 20} MiB to fetch) does not fit in the image "
                      f"cache ({bound >> 20} MiB, image_cache_bytes) beside the images "
                      "templates need")  # fmt: skip


def evict(cache: ImageCache, bound: int, pinned: set[str]) -> Report:
    """Untag unpinned images, least recently used first, until the blobs fit in `bound`.
    Node-local images are neither candidates nor counted (`_cached`)."""
    with cache.locked():
        tags, own = _cached(cache)
        usage = _usage(cache)

        def size(blobs: set[str]) -> int:
            return _size(cache, blobs - own)

        pinned_blobs = set().union(*(tags[t] for t in pinned if t in tags))
        report = Report(size(cache.cached_blobs()), size(pinned_blobs))
        # Which to untag is worked out from the tags' blob sets (a blob stays while any
        # remaining image references it); then one garbage collection removes the blobs.
        report.evicted = lru.evictions(
            tags, usage, pinned, lambda keep: size(set().union(*(tags[t] for t in keep))),
            bound)  # fmt: skip
        total = size(set().union(*(b for t, b in tags.items() if t not in report.evicted)))
        for tag in report.evicted:
            umoci("remove", "--image", f"{cache.layout}:{tag}")
            usage.pop(tag, None)
            EVICTIONS.inc()
        if report.evicted or total < report.total:
            umoci("gc", "--layout", str(cache.layout))
            write_json_atomic(cache.root / USAGE, usage)
            report.total = size(cache.cached_blobs())
    CACHE_BYTES.labels("total").set(report.total)
    CACHE_BYTES.labels("pinned").set(report.pinned)
    if report.total > bound:
        log.warning("image cache holds %d MiB, over its bound of %d MiB: the images templates "
                    "need (pinned) take %d MiB", report.total >> 20, bound >> 20,
                    report.pinned >> 20)  # fmt: skip
    return report
