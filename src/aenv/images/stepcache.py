"""The step cache: after each build step, the build VM's snapshot and the state the next
step starts in (env, user, workdir), under the hash chain of the steps so far.

Entries are bounded (`step_cache_bytes`): the least recently used go first, with their
snapshots. A snapshot is removed only when no entry refers to it (steps that change no file,
such as ENV, share the previous step's), and `orphans` names build snapshots that no entry
refers to (a build that ended between its snapshot and its entry), for start-up to remove."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aenv.storage.files import write_json_atomic

_KEY = re.compile(r"[a-f0-9]{64}")


@dataclass(frozen=True)
class StepState:
    env: dict[str, str] = field(default_factory=dict)
    user: str = "user"
    workdir: str = "/home/user"


@dataclass(frozen=True)
class CacheEntry:
    snapshot_id: str
    state: StepState


class StepCache:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        assert _KEY.fullmatch(key), key
        return self.root / f"{key}.json"

    def get(self, key: str, *, touch: bool = False) -> CacheEntry | None:
        path = self._path(key)
        try:
            d = json.loads(path.read_text())
            entry = CacheEntry(str(d["snapshot_id"]), StepState(**d["state"]))
            if touch:  # the entry's mtime is its last use, for eviction
                os.utime(path)
            return entry
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, entry: CacheEntry) -> CacheEntry | None:
        """Store `entry`; returns the entry it replaced (a forced rebuild), if any."""
        old = self.get(key)
        write_json_atomic(self._path(key), {"snapshot_id": entry.snapshot_id,
                                            "state": asdict(entry.state)})  # fmt: skip
        return old if old is not None and old != entry else None

    def remove(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def referenced(self) -> set[str]:
        return {e.snapshot_id for e in self.entries().values()}

    def by_age(self) -> list[tuple[str, CacheEntry]]:
        """Entries, least recently used first."""
        def mtime(key: str) -> float:
            try:
                return self._path(key).stat().st_mtime
            except OSError:
                return 0.0

        return sorted(self.entries().items(), key=lambda kv: mtime(kv[0]))

    def entries(self) -> dict[str, CacheEntry]:
        out = {}
        for p in self.root.glob("*.json"):
            e = self.get(p.stem)
            if e is not None:
                out[p.stem] = e
        return out
