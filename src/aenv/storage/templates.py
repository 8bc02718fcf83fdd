"""Template catalog: a template is a name, a recipe, a raw rootfs image and the snapshot
its build ended with (restoring that snapshot is what makes creates cheap)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from aenv.config import MachineShape
from aenv.storage.files import write_json_atomic

MAX_VERSIONS = 8  # earlier builds of one name kept for their tags (the oldest go first)


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
    # Earlier builds that still have tags of their own, newest first: E2B keeps every build
    # of a name, and Harbor builds one per CPU/memory variant of an environment under one
    # name (tag `c2-m4096-…`), so a new build must not take the other variants' tags away.
    versions: list[Template] = field(default_factory=list)

    def names(self, tag: str) -> bool:
        """Whether `tag` names this build: one of its tags, or its build id."""
        return tag in (*self.tags, self.e2b_build_id, *self.build_ids)

    def version(self, tag: str) -> Template | None:
        """The build `name:tag` creates from: this one (no tag, `default`, or one of its
        own), an earlier one that kept the tag, or None."""
        if not tag or tag == "default" or self.names(tag):
            return self
        return next((v for v in self.versions if v.names(tag)), None)

    def succeed(self, new: Template) -> list[str]:
        """`new` replaces this build: the tags it carries move to it, earlier builds left
        with a tag of their own stay its versions (at most MAX_VERSIONS), and the snapshots
        of those that go are returned (to delete)."""
        return new.keep_versions([replace(self, versions=[]), *self.versions])

    def retag(self, tag: str | None, tags: list[str]) -> list[str]:
        """`tags` move to the build `tag` names (this one when None); snapshots of earlier
        builds left with no tag are returned (to delete). TemplateMissing: no such build."""
        target = self.version(tag or "")
        if target is None:
            raise TemplateMissing(f"{self.name}:{tag}")
        for b in [self, *self.versions]:
            b.tags = sorted(set(b.tags) | set(tags)) if b is target else [
                x for x in b.tags if x not in tags]  # fmt: skip
        return self.keep_versions(self.versions)

    def untag(self, tags: list[str]) -> list[str]:
        """`tags` off every build; snapshots of earlier builds left with none (to delete)."""
        for b in [self, *self.versions]:
            b.tags = [x for x in b.tags if x not in tags]
        return self.keep_versions(self.versions)

    def keep_versions(self, earlier: list[Template]) -> list[str]:
        kept, gone = [], []
        for v in earlier:
            v.tags = [x for x in v.tags if x not in self.tags]
            if v.snapshot_id == self.snapshot_id:
                continue
            (kept if v.tags and len(kept) < MAX_VERSIONS else gone).append(v)
        self.versions = kept
        return [v.snapshot_id for v in gone]

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["shape"] = self.shape.model_dump()
        d["versions"] = [v.to_json() for v in self.versions]
        return d

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Template:
        d = dict(d)
        d["shape"] = MachineShape.model_validate(d["shape"])
        d["versions"] = [cls.from_json(v) for v in d.get("versions") or []]  # type: ignore[attr-defined]
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
