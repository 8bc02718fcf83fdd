"""Snapshot repository: device state + RAM file + disk file + a JSON manifest, stored by
reflink under the snapshot id. Templates are named snapshots.

A snapshot directory becomes visible only by an atomic rename of a complete, fsynced
staging directory, so a crash never leaves a half-written snapshot listed.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from aenv.config import MachineShape
from aenv.storage.files import clone, fsync_path, write_json_atomic

FORMAT_VERSION = 1
FILES = ("state", "memory", "disk")


class SnapshotNotFound(Exception):
    pass


class SnapshotCorrupt(Exception):
    pass


@dataclass
class Manifest:
    snapshot_id: str
    shape: MachineShape
    kernel: str  # path of the kernel the guest runs (its memory holds that kernel)
    tools: str  # path of the tools drive the guest has mounted
    cmdline: str
    template: str
    parent: str | None = None
    names: list[str] = field(default_factory=list)
    env_vars: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["shape"] = self.shape.model_dump()
        return d

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Manifest:
        if d.get("format_version") != FORMAT_VERSION:
            raise SnapshotCorrupt(f"unsupported snapshot format {d.get('format_version')!r}")
        d = dict(d)
        d["shape"] = MachineShape.model_validate(d["shape"])
        return cls(**d)  # type: ignore[arg-type]


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class SnapshotStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, snapshot_id: str) -> Path:
        if not snapshot_id or "/" in snapshot_id or snapshot_id.startswith("."):
            raise SnapshotNotFound(snapshot_id)
        return self.root / snapshot_id

    def new_id(self) -> str:
        return "snap-" + uuid.uuid4().hex[:16]

    def put(self, manifest: Manifest, sources: dict[str, Path]) -> Path:
        """Clone `sources` (state, memory, disk) into a new snapshot; return its dir."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.path(manifest.snapshot_id)
        stage = self.root / f".tmp-{manifest.snapshot_id}"
        stage.mkdir(mode=0o755)
        try:
            for name in FILES:
                dst = stage / name
                clone(sources[name], dst)
                fsync_path(dst)
                dst.chmod(0o444)  # shared artifacts: root-owned, read-only for jails
            manifest.created_at = manifest.created_at or now_rfc3339()
            write_json_atomic(stage / "manifest.json", manifest.to_json())
            os.replace(stage, final)
            fsync_path(self.root)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        return final

    def get(self, snapshot_id: str) -> Manifest:
        p = self.path(snapshot_id) / "manifest.json"
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise SnapshotNotFound(snapshot_id) from None
        except ValueError as e:
            raise SnapshotCorrupt(f"{snapshot_id}: bad manifest: {e}") from e
        m = Manifest.from_json(data)
        for name in FILES:
            if not (self.path(snapshot_id) / name).is_file():
                raise SnapshotCorrupt(f"{snapshot_id}: missing {name}")
        return m

    def file(self, snapshot_id: str, name: str) -> Path:
        return self.path(snapshot_id) / name

    def list(self) -> list[str]:
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and not p.name.startswith("."))

    def delete(self, snapshot_id: str) -> None:
        p = self.path(snapshot_id)
        if not p.exists():
            raise SnapshotNotFound(snapshot_id)
        trash = self.root / f".del-{snapshot_id}-{uuid.uuid4().hex[:6]}"
        os.replace(p, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def gc_staging(self) -> None:
        """Remove staging/deleted leftovers of an interrupted put or delete."""
        if self.root.exists():
            for p in self.root.iterdir():
                if p.name.startswith((".tmp-", ".del-")):
                    shutil.rmtree(p, ignore_errors=True)
