"""What a test of images and builds leaves on the host's data directory, and its removal:
templates (built, and the `image-…` ones builds make of their base images), their snapshots,
and step-cache entries. Caches are the node's to keep; a test removes its own."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

from aenv.storage.snapshots import SnapshotNotFound, SnapshotStore
from aenv.storage.templates import TemplateCatalog, TemplateMissing
from tests.support.host import DATA_DIR


def _templates() -> set[str]:
    d = DATA_DIR / "templates"
    return {p.name for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")}


def _cache_entries() -> set[Path]:
    d = DATA_DIR / "images" / "step-cache"
    return set(d.glob("*.json")) if d.is_dir() else set()


@contextlib.contextmanager
def removed_after() -> Iterator[None]:
    """Templates and step-cache entries that appear while inside are removed at the end."""
    templates, entries = _templates(), _cache_entries()
    try:
        yield
    finally:
        catalog = TemplateCatalog(DATA_DIR / "templates")
        store = SnapshotStore(DATA_DIR / "snapshots")
        for name in _templates() - templates:
            with contextlib.suppress(TemplateMissing, SnapshotNotFound):
                store.delete(catalog.get(name).snapshot_id)
            shutil.rmtree(catalog.dir(name), ignore_errors=True)
        for entry in _cache_entries() - entries:
            with contextlib.suppress(OSError, ValueError, KeyError, SnapshotNotFound):
                store.delete(json.loads(entry.read_text())["snapshot_id"])
            entry.unlink(missing_ok=True)
