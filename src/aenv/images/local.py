"""Node-local images: references this node answers itself, with no registry behind them.

A template exported as an image (`images.export`: the minimal Debian as
`localhost/aenv/base-minimal`, the familiar base as `localhost/aenv/base` and as the offline
stand-in for `e2bdev/base`) is stored in the image cache's layout like any pulled image, and
named here: `local.json` maps each canonical reference to the manifest digest it stands for
and the template it was exported from. A pull of such a reference is answered from the
layout without asking any registry (a stand-in must never be "refreshed" from Docker Hub), and
its blobs are outside the cache's bound: never evicted (nothing could fetch them again) and
not counted (`eviction._cached`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from aenv.images.reference import Reference
from aenv.storage.files import write_json_atomic

LOCAL = "local.json"


@dataclass(frozen=True)
class LocalImage:
    digest: str  # the manifest in the layout
    template: str  # exported from this template...
    snapshot_id: str  # ...as it was at this snapshot (a rebuild exports again)


class LocalImages:
    def __init__(self, root: Path) -> None:
        self.path = root / LOCAL

    def all(self) -> dict[str, LocalImage]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except ValueError:
            return {}  # a damaged record: the next export rewrites it
        return {k: LocalImage(**v) for k, v in raw.items() if isinstance(v, dict)}

    def get(self, ref: Reference) -> LocalImage | None:
        return self.all().get(str(ref)) if ref.digest is None else None

    def put(self, refs: list[Reference], image: LocalImage) -> None:
        """Callers hold the cache's lock (one writer of the layout and of this file)."""
        records = {k: asdict(v) for k, v in self.all().items()}
        for ref in refs:
            records[str(ref)] = asdict(image)
        write_json_atomic(self.path, records)

    def drop(self, refs: list[Reference]) -> None:
        """Callers hold the cache's lock. Their blobs may be evicted from then on."""
        records = {k: asdict(v) for k, v in self.all().items()}
        if any(records.pop(str(ref), None) is not None for ref in refs):
            write_json_atomic(self.path, records)

    def tags(self) -> set[str]:
        """The layout tags the local images are stored under."""
        from aenv.images.cache import layout_tag

        return {layout_tag(x.digest) for x in self.all().values()}
