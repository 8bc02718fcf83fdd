"""The leak census for tests: check a node instance's resources, and release an instance a
test made for itself (so no test leaves a database or directory behind)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from aenv import config
from aenv.orchestrator import census as census_mod
from aenv.orchestrator.reclaim import reclaim
from aenv.storage.snapshots import SnapshotStore
from tests.support.host import DATA_DIR

# What a stopped node instance leaves by design: its database and (empty) VM directory.
STOPPED_NODE_KINDS = frozenset({"instdir", "db"})


def new_instance(prefix: str = "e") -> str:
    return prefix + os.urandom(3).hex()


def cfg_for(instance: str) -> config.Config:
    return config.load(env={}, data_dir=DATA_DIR, instance=instance)


def problems(instance: str, *, allow: Iterable[str] = (),
             records: Mapping[str, Mapping[str, str]] | None = None,
             live: Iterable[str] | None = None) -> list[str]:  # fmt: skip
    """The census diff of one instance as lines (empty: clean), leaks of kinds in `allow`
    left out."""
    c = census_mod.census(cfg_for(instance), instance)
    d = census_mod.diff(c, records, live=live)  # type: ignore[arg-type]
    d.leaks = [x for x in d.leaks if x.resource.kind not in set(allow)]
    return d.lines()


def release(instance: str) -> None:
    """Reclaim everything of `instance` (as a node start would, keeping nothing), then its
    database and directory: after a test, whether it passed or not."""
    cfg = cfg_for(instance)
    reclaim(cfg, SnapshotStore(cfg.snapshots_dir), live_vms=set(), keep_dirs=(), keep_slots=())
    for f in DATA_DIR.glob(f"{instance}.db*"):
        f.unlink()
    if cfg.sandboxes_dir.exists():
        cfg.sandboxes_dir.rmdir()


def check_stopped(instance: str) -> list[str]:
    """Problems of an instance whose node has stopped (its database and directory allowed)."""
    return problems(instance, allow=STOPPED_NODE_KINDS)
