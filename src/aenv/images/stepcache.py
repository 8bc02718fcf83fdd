"""The step cache: after each build step, the build VM's snapshot and the state the next
step starts in (env, user, workdir), under the hash chain of the steps so far."""

from __future__ import annotations

import json
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

    def get(self, key: str) -> CacheEntry | None:
        try:
            d = json.loads(self._path(key).read_text())
            return CacheEntry(str(d["snapshot_id"]), StepState(**d["state"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, entry: CacheEntry) -> None:
        write_json_atomic(self._path(key), {"snapshot_id": entry.snapshot_id,
                                            "state": asdict(entry.state)})  # fmt: skip

    def entries(self) -> dict[str, CacheEntry]:
        out = {}
        for p in self.root.glob("*.json"):
            e = self.get(p.stem)
            if e is not None:
                out[p.stem] = e
        return out
