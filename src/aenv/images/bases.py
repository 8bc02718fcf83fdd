"""The node's base templates, as `aenv setup` (and a node that lacks its `base`) make them.

- `base-minimal`: the minimal Debian (recipe `debian`), exported as the node-local image
  `localhost/aenv/base-minimal`.
- `base`: the familiar base (recipe `familiar`: that Debian plus what E2B's base image gives,
  Python with pip, Node.js with npm, a compiler toolchain), exported as `localhost/aenv/base`
  and as the offline `e2bdev/base`. With `--minimal-base`, `base` is the minimal Debian.

Both are made on the host from Debian's signed packages (`storage.rootfs`, package code
confined by `storage.confined`), then booted and snapshotted as any recipe template. Builds
and exports are skipped when what they were made from has not changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from aenv.config import Config
from aenv.images import export
from aenv.images.reference import Reference, parse
from aenv.images.templates import image_cache
from aenv.orchestrator.builder import build_rootfs, build_template
from aenv.orchestrator.pending import PendingTemplates
from aenv.storage import children
from aenv.storage.snapshots import SnapshotNotFound
from aenv.storage.templates import Template, TemplateMissing

log = logging.getLogger("aenv.images")
MINIMAL, FAMILIAR = "base-minimal", "base"
MINIMAL_IMAGE = parse("localhost/aenv/base-minimal")
FAMILIAR_IMAGES = [parse("e2bdev/base"), parse("localhost/aenv/base")]
RECIPES = {MINIMAL: "debian", FAMILIAR: "familiar"}
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


def prepare_rootfs(cfg: Config, which: list[tuple[str, str]],
                   progress: Callable[[str], None]) -> None:  # fmt: skip
    """The root filesystems of templates `which` (name, recipe), cached, made before their
    kernel is there: made while it compiles, they cost no time of their own."""
    for name, recipe in which:
        build_rootfs(cfg, name, recipe, cfg.default_shape.disk_mib, progress)


async def minimal(rt: Any, name: str, force: bool, progress: Callable[[str], None]) -> None:
    """The minimal Debian as template `name` (`base-minimal`, or `base` itself)."""
    await build_template(rt, name, RECIPES[MINIMAL], progress=progress, force=force)
    # tar and umoci take seconds: off the event loop.
    await asyncio.to_thread(export_as, rt, name, [MINIMAL_IMAGE], progress)
    if name == FAMILIAR:  # `base` is the minimal one now: no familiar image stands for it
        cache = image_cache(rt.cfg)
        with cache.locked():
            cache.local.drop(FAMILIAR_IMAGES)
        _drop_minimal(rt, progress)


async def familiar(rt: Any, force: bool, progress: Callable[[str], None],
                   made: Callable[[], None] = lambda: None) -> None:  # fmt: skip
    """The familiar `base` (`made` once creates may use it), then its images."""
    await build_template(rt, FAMILIAR, RECIPES[FAMILIAR], progress=progress, force=force)
    made()
    await asyncio.to_thread(export_as, rt, FAMILIAR, FAMILIAR_IMAGES, progress)


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


class InBackground:
    """A node whose default template is `base` and has none makes the familiar one while it
    serves (`make run` serves once `base-minimal` is ready). Meanwhile `base` is pending: a
    create of it waits, then gets 503 with Retry-After (`orchestrator.pending`)."""

    STOP_WAIT_S = 60.0  # a stopping node lets a boot or an export end before it cancels

    def __init__(self, rt: Any, pending: PendingTemplates) -> None:
        self.rt = rt
        self.pending = pending
        self.children = children.Children()
        self.task: asyncio.Task[None] | None = None
        self._status = "starting"

    def wanted(self) -> bool:
        if self.rt.cfg.default_template != FAMILIAR or not self.rt.cfg.build_base:
            return False
        try:
            self.rt.catalog.get(FAMILIAR)
            return False
        except TemplateMissing:
            return True

    def start(self) -> None:
        if self.wanted():
            self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        def progress(message: str) -> None:
            self._status = message
            log.info("base: %s", message)

        pending = self.pending.add([FAMILIAR], "build", lambda: self._status)
        try:
            with children.stoppable(self.children):
                # Creates wait only for the template: its export (seconds) comes after.
                await familiar(self.rt, False, progress, lambda: self.pending.end(pending))
        except children.Stopped:
            log.info("base: the node stopped before its build ended")
        except Exception:
            log.exception("base: the build failed (`aenv setup` builds it again)")
        finally:
            self.pending.end(pending)

    async def close(self) -> None:
        if self.task is None or self.task.done():
            return
        self.children.stop()  # a debootstrap or apt ends now; its staging directory goes
        await asyncio.wait({self.task}, timeout=self.STOP_WAIT_S)
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
