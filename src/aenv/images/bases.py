"""The node's base templates, as `aenv setup` makes them.

- The minimal Debian (debootstrap; `base-minimal`, or `base` itself with `--minimal-base`)
  is exported as the node-local image `localhost/aenv/base-minimal`.
- The familiar `base` (`images.familiar`) is built from that image through the template
  build API, then exported as `localhost/aenv/base` and as the offline `e2bdev/base`.

Exports and the familiar build are skipped when what they were made from has not changed.
The familiar build needs a serving node, so it runs between two runtimes (`cli.setup`).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aenv.images import export, familiar
from aenv.images.reference import Reference
from aenv.images.templates import image_cache
from aenv.orchestrator.builder import build_template
from aenv.storage.snapshots import SnapshotNotFound
from aenv.storage.templates import Template, TemplateMissing

MINIMAL, FAMILIAR = "base-minimal", "base"
KEY_FILE = "familiar.key"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class FamiliarPlan:
    """A familiar build to run: its context (Dockerfile + debs/) and the key it will meet."""

    work: tempfile.TemporaryDirectory[str]
    key: str

    @property
    def context(self) -> Path:
        return Path(self.work.name)


def export_as(rt: Any, name: str, refs: list[Reference],
              progress: Callable[[str], None]) -> None:
    """Template `name` exported under `refs`, unless they already name its snapshot."""
    t: Template = rt.catalog.get(name)
    cache = image_cache(rt.cfg)
    records = cache.local.all()
    if all((r := records.get(str(ref))) is not None and r.snapshot_id == t.snapshot_id
           and cache.find(ref, r.digest) is not None for ref in refs):  # fmt: skip
        progress(f"image {refs[0]} is up to date")
        return
    progress(f"exporting template {name} as {', '.join(map(str, refs))}")
    env = dict(t.env) or {"PATH": DEFAULT_PATH}
    cfg = export.ExportConfig(env=env, user=t.user or "user", workdir=t.workdir or "/home/user")
    digest = export.export(cache, rt.snapshots.file(t.snapshot_id, "disk"), refs, cfg, name,
                           t.snapshot_id)  # fmt: skip
    t.source_image = f"{refs[0]}@{digest}"
    rt.catalog.put(t)
    progress(f"image {refs[0]}: {digest}")


async def minimal(rt: Any, name: str, force: bool, progress: Callable[[str], None]) -> None:
    await build_template(rt, name, "debian", progress=progress, force=force)
    # tar and umoci take seconds: off the event loop, as finish_familiar's export is.
    await asyncio.to_thread(export_as, rt, name, [familiar.MINIMAL_IMAGE], progress)
    if name == FAMILIAR:  # `base` is the minimal one now: no familiar image stands for it
        cache = image_cache(rt.cfg)
        with cache.locked():
            cache.local.drop(familiar.FAMILIAR_IMAGES)
        _drop_minimal(rt, progress)


def _drop_minimal(rt: Any, progress: Callable[[str], None]) -> None:
    """The `base-minimal` of an earlier full setup goes: `base` is that Debian now, and the
    image name it was exported under names `base`'s export. Kept, it would pin its old
    export's blobs in the image cache for good (no name left to count them as local)."""
    try:
        old: Template = rt.catalog.get(MINIMAL)
    except TemplateMissing:
        return
    rt.remove_template(MINIMAL)
    with contextlib.suppress(SnapshotNotFound):
        rt.snapshots.delete(old.snapshot_id)  # its sandboxes keep their reflinked files
    progress(f"removed template {MINIMAL}: {FAMILIAR} is the minimal Debian now")


def plan_familiar(rt: Any, force: bool, progress: Callable[[str], None]) -> FamiliarPlan | None:
    """The familiar build to run, or None when `base` is already that build."""
    low: Template = rt.catalog.get(MINIMAL)
    disk = rt.snapshots.file(low.snapshot_id, "disk")
    work = tempfile.TemporaryDirectory(dir=rt.cfg.images_dir, prefix=".familiar-")
    try:
        try:
            key = familiar.build_key(low.snapshot_id,
                                     familiar.resolve_packages(disk, Path(work.name)))
        except familiar.FamiliarError as e:
            if not _built(rt):
                raise
            progress(f"keeping template {FAMILIAR} as it is: {e}")  # an offline host
            work.cleanup()
            return None
        if not force and _built(rt) == key:
            progress(f"template {FAMILIAR} is up to date")
            work.cleanup()
            return None
        progress(f"downloading the familiar base's packages ({', '.join(familiar.PACKAGES)})")
        debs = familiar.download_packages(disk, Path(work.name))
        familiar.write_context(Path(work.name))
        progress(f"{len(debs)} packages to install into {FAMILIAR}")
        return FamiliarPlan(work, key)
    except BaseException:
        work.cleanup()
        raise


def _built(rt: Any) -> str | None:
    """The key of the familiar build `base` is, if it is one and its snapshot is here."""
    with contextlib.suppress(TemplateMissing, OSError):
        t: Template = rt.catalog.get(FAMILIAR)
        if t.recipe == "build" and rt.has_snapshot(t.snapshot_id):
            return (rt.catalog.dir(FAMILIAR) / KEY_FILE).read_text().strip()
    return None


def finish_familiar(rt: Any, plan: FamiliarPlan | None, progress: Callable[[str], None]) -> None:
    """After the build: export `base`, note what it was built from, drop the rootfs files
    a recipe-built `base` of an older install left (a build's disk is its snapshot's)."""
    t: Template = rt.catalog.get(FAMILIAR)
    if plan is not None:
        (rt.catalog.dir(FAMILIAR) / KEY_FILE).write_text(plan.key + "\n")
    if t.recipe == "build":
        for old in rt.catalog.dir(FAMILIAR).glob("rootfs-*.ext4"):
            old.unlink(missing_ok=True)
    export_as(rt, FAMILIAR, familiar.FAMILIAR_IMAGES, progress)
