"""Template catalog: a template is a name, a recipe, a raw rootfs image and the snapshot
its build ended with (restoring that snapshot is what makes creates cheap)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aenv.config import MachineShape
from aenv.storage.files import write_json_atomic


class TemplateMissing(Exception):
    pass


@dataclass
class Template:
    name: str
    recipe: str
    shape: MachineShape
    snapshot_id: str
    build_key: str  # hash of recipe + kernel + tools + shape: a change means a rebuild
    created_at: str
    aliases: list[str] = field(default_factory=list)
    envd_version: str = ""
    rootfs_bytes: int = 0
    # An image's template: where it came from, and its config as sandbox defaults.
    source_image: str = ""  # registry/repository[:tag]@digest
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    workdir: str | None = None
    start_cmd: str | None = None
    # An E2B build's: its tags (`name:tag` resolves to this build) and build id (a UUID).
    tags: list[str] = field(default_factory=list)
    e2b_build_id: str = ""
    build_ids: list[str] = field(default_factory=list)  # builds that joined it (its ids too)
    # Set on a copy this node fetched from a peer or the snapshot store (cluster/sharing.py):
    # where from and when. Not this node's own: not listed, never published from here.
    fetched: dict[str, object] | None = None

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["shape"] = self.shape.model_dump()
        return d

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Template:
        d = dict(d)
        d["shape"] = MachineShape.model_validate(d["shape"])
        return cls(**d)  # type: ignore[arg-type]


class TemplateCatalog:
    def __init__(self, root: Path) -> None:
        self.root = root

    def dir(self, name: str) -> Path:
        return self.root / name

    def get(self, name: str) -> Template:
        if not name or "/" in name or name.startswith("."):
            raise TemplateMissing(name)
        try:
            return Template.from_json(json.loads((self.dir(name) / "template.json").read_text()))
        except (FileNotFoundError, NotADirectoryError):
            raise TemplateMissing(name) from None
        except (ValueError, TypeError, KeyError) as e:
            raise TemplateMissing(f"{name} (corrupt template.json: {e})") from e

    def put(self, t: Template) -> None:
        self.dir(t.name).mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.dir(t.name) / "template.json", t.to_json())

    def list(self) -> list[Template]:
        out = []
        if self.root.exists():
            for p in sorted(self.root.iterdir()):
                if p.is_dir() and not p.name.startswith("."):
                    try:
                        out.append(self.get(p.name))
                    except TemplateMissing:
                        continue
        return out
