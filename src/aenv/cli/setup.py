"""`aenv setup`: everything a node needs before it serves — the reflink data filesystem,
the guest kernel, the tools drive and the default template. Cached: a second run is quick.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import typer

from aenv import config as config_mod
from aenv.cli.output import build_progress
from aenv.images import bases, recipes
from aenv.images.registry import RegistryError
from aenv.machines.runtime import Runtime
from aenv.orchestrator.builder import BuildError, kernel_path
from aenv.orchestrator.reclaim import reclaim_runtime
from aenv.storage import datafs
from aenv.storage.datafs import DataFsError
from aenv.storage.kernel import KernelBuildError, is_built
from aenv.storage.packages import PackagesError
from aenv.storage.rootfs import RootfsError
from aenv.storage.tools import ensure_tools
from aenv.vmm.base import VmmError

T = TypeVar("T")


async def _in_runtime(cfg: config_mod.Config, work: Callable[[Runtime], Awaitable[T]]) -> T:
    rt = Runtime(cfg)
    await rt.start()
    try:
        await reclaim_runtime(rt)
        return await work(rt)
    finally:
        await rt.close()


async def _prepare(cfg: config_mod.Config, rootfs: list[tuple[str, str]],
                   say: Callable[[str], None]) -> None:  # fmt: skip
    """The guest kernel, the tools drive and the base templates' root filesystems at once:
    debootstrap and apt mostly wait on the network and the disk while the kernel compiles.
    First the data filesystem they go on (a runtime would mount it too, later)."""
    await asyncio.to_thread(datafs.ensure, cfg.data_dir, cfg.data_image_size_gib)
    await asyncio.gather(
        asyncio.to_thread(kernel_path, cfg, say),
        asyncio.to_thread(ensure_tools, cfg.artifacts_dir, say),
        asyncio.to_thread(bases.prepare_rootfs, cfg, rootfs, say),
    )


async def _base(cfg: config_mod.Config, minimal_base: bool, defer_base: bool, force: bool,
                say: Callable[[str], None]) -> None:  # fmt: skip
    """`base`: the minimal Debian itself, or the familiar base beside `base-minimal`
    (images.bases). `defer_base`: the node makes a missing familiar `base` once it serves."""
    if minimal_base:
        await _prepare(cfg, [(bases.FAMILIAR, bases.RECIPES[bases.MINIMAL])], say)
        await _in_runtime(cfg, lambda rt: bases.minimal(rt, bases.FAMILIAR, force, say))
        return
    have_base = (cfg.templates_dir / bases.FAMILIAR / "template.json").exists()
    defer = defer_base and not have_base
    rootfs = [(bases.MINIMAL, bases.RECIPES[bases.MINIMAL])]
    # Deferred, the familiar root filesystem is made here only while a kernel compiles
    # anyway; otherwise the node makes it while it serves.
    if not defer or not (cfg.kernel_path or is_built(cfg.artifacts_dir)):
        rootfs.append((bases.FAMILIAR, bases.RECIPES[bases.FAMILIAR]))
    await _prepare(cfg, rootfs, say)
    await _in_runtime(cfg, lambda rt: bases.minimal(rt, bases.MINIMAL, force, say))
    if defer:
        say(f"template {bases.FAMILIAR}: the node makes it once it serves (meanwhile "
            f"`aenv template ls` shows it building, and creates of it wait for it)")
        return
    await _in_runtime(cfg, lambda rt: bases.familiar(rt, force, say))


async def _setup(templates: list[str], force: bool, minimal_base: bool,
                 defer_base: bool) -> None:  # fmt: skip
    cfg = config_mod.load()
    say, stop = build_progress()  # a spinner on a terminal, timestamped lines otherwise
    try:
        for spec in templates:
            name, _, recipe = spec.partition("=")
            if name == bases.FAMILIAR and not recipe:
                await _base(cfg, minimal_base, defer_base, force, say)
                continue
            await _in_runtime(cfg, lambda rt, n=name, r=recipe: recipes.build(
                rt, n, r or n, progress=say, force=force))  # fmt: skip
    finally:
        stop()


def setup(template: list[str], force: bool, minimal_base: bool, defer_base: bool) -> None:
    """Prepare this host: data filesystem, guest kernel, tools drive, templates."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a request per agent call
    try:
        asyncio.run(_setup(template, force, minimal_base, defer_base))
    except (BuildError, KernelBuildError, RootfsError, DataFsError, VmmError, RegistryError,
            PackagesError) as e:
        print(f"aenv setup: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
