"""Template builds: recipe → raw ext4 rootfs → cold boot → agent ready → snapshot.

Each step is cached by the hash of its inputs (the rootfs by recipe; the snapshot by
rootfs + kernel + tools drive + machine shape). A failed build leaves nothing behind:
work happens in staging paths that are renamed into place only when complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from aenv.config import Config, MachineShape
from aenv.guest.agent.version import ENVD_VERSION
from aenv.machines.machine import kernel_cmdline
from aenv.machines.runtime import Runtime
from aenv.storage import rootfs
from aenv.storage.kernel import ensure_kernel
from aenv.storage.recipes import RECIPES
from aenv.storage.snapshots import Manifest, SnapshotNotFound, now_rfc3339
from aenv.storage.templates import Template, TemplateMissing
from aenv.storage.tools import ensure_tools

log = logging.getLogger(__name__)


class BuildError(Exception):
    pass


def kernel_path(cfg: Config, progress: Callable[[str], None]) -> Path:
    if cfg.kernel_path is not None:
        if not cfg.kernel_path.is_file():
            raise BuildError(f"configured kernel {cfg.kernel_path} does not exist")
        return cfg.kernel_path
    return ensure_kernel(cfg.artifacts_dir, log=progress)


def _file_key(p: Path) -> str:
    st = p.stat()
    return f"{p}:{st.st_size}:{st.st_mtime_ns}"


def build_rootfs(cfg: Config, name: str, recipe: str, disk_mib: int,
                 progress: Callable[[str], None], source: Path | None = None,
                 fill: Callable[[Path], None] | None = None) -> Path:
    """The template's raw ext4 image, cached by recipe (+ source dir) and disk size. `fill`
    makes the tree itself (an image unpacked in place: `recipe` then names its digest)."""
    known = RECIPES.get(recipe)
    if known is None and source is None and fill is None:
        raise BuildError(f"unknown recipe {recipe!r} (known: {', '.join(RECIPES)})")
    tag = f"{recipe}:{known.version if known else None}:{disk_mib}:{source}"
    key = hashlib.sha256(tag.encode()).hexdigest()
    image = cfg.templates_dir / name / f"rootfs-{key[:12]}.ext4"
    if image.exists():
        return image
    image.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cfg.templates_dir, prefix=f".tmp-{name}-") as tmp:
        root = Path(tmp, "root")
        logf = Path(tmp, "build.log")
        if fill is not None:
            fill(root)
        elif source is not None:
            progress(f"copying rootfs from {source}")
            shutil.copytree(source, root, symlinks=True)
        else:
            root.mkdir()
            assert known is not None
            known.make(root, logf, progress)
        progress(f"making {disk_mib} MiB ext4 image")
        staged = Path(tmp, "rootfs.ext4")
        rootfs.make_ext4(root, staged, disk_mib, logf)
        staged.chmod(0o444)
        os.replace(staged, image)
    for old in image.parent.glob("rootfs-*.ext4"):
        if old != image:
            old.unlink(missing_ok=True)
    return image


async def build_template(rt: Runtime, name: str, recipe: str = "debian",
                         shape: MachineShape | None = None,
                         progress: Callable[[str], None] = print,
                         source: Path | None = None, force: bool = False,
                         fill: Callable[[Path], None] | None = None) -> Template:
    cfg = rt.cfg
    shape = shape or cfg.default_shape
    kernel = await asyncio.to_thread(kernel_path, cfg, progress)
    tools = await asyncio.to_thread(ensure_tools, cfg.artifacts_dir, progress)
    image = await asyncio.to_thread(build_rootfs, cfg, name, recipe, shape.disk_mib, progress,
                                    source, fill)
    cmdline = kernel_cmdline(cfg.kernel_cmdline_extra)
    key = hashlib.sha256(
        "|".join([_file_key(image), _file_key(kernel), str(tools), cmdline,
                  shape.model_dump_json()]).encode()
    ).hexdigest()[:16]
    try:
        old = rt.catalog.get(name)
    except TemplateMissing:
        old = None
    if old is not None and old.build_key == key and not force:
        try:
            rt.snapshots.get(old.snapshot_id)
            progress(f"template {name} is up to date")
            return old
        except SnapshotNotFound:
            pass

    progress(f"booting {name} to snapshot it")
    try:
        manifest = await _boot_and_snapshot(rt, name, key, shape, kernel, tools, image,
                                            cmdline)  # fmt: skip
    except BaseException:
        if old is None:  # a failed or cancelled first build leaves no directory behind
            shutil.rmtree(image.parent, ignore_errors=True)
        raise
    t = Template(
        name=name, recipe=recipe, shape=shape, snapshot_id=manifest.snapshot_id,
        build_key=key, created_at=now_rfc3339(), envd_version=ENVD_VERSION,
        rootfs_bytes=image.stat().st_blocks * 512,
    )
    rt.catalog.put(t)
    if old is not None and old.snapshot_id != t.snapshot_id:
        with contextlib.suppress(SnapshotNotFound):
            rt.snapshots.delete(old.snapshot_id)
    progress(f"template {name} ready (snapshot {t.snapshot_id})")
    return t


async def _boot_and_snapshot(rt: Runtime, name: str, key: str, shape: MachineShape,
                             kernel: Path, tools: Path, image: Path, cmdline: str
                             ) -> Manifest:  # fmt: skip
    vm_name = f"build-{name}-{uuid.uuid4().hex[:6]}"
    m = await rt.cold_boot(vm_name, shape, kernel, tools, image, cmdline)
    try:
        manifest = Manifest(
            snapshot_id=f"tpl-{name}-{key[:8]}-{uuid.uuid4().hex[:6]}", shape=shape,
            kernel=str(kernel), tools=str(tools), cmdline=cmdline, template=name,
            names=[name],
        )
        await rt.snapshot(m.name, manifest)
        return manifest
    finally:
        await rt.destroy(m.name)
