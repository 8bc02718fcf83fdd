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
from aenv.api.auth import resolve_api_key
from aenv.cli.output import build_progress
from aenv.images import bases, familiar
from aenv.images.familiar import FamiliarError
from aenv.images.registry import RegistryError
from aenv.machines.runtime import Runtime
from aenv.orchestrator.builder import BuildError, build_template
from aenv.orchestrator.reclaim import reclaim_runtime
from aenv.storage.datafs import DataFsError
from aenv.storage.kernel import KernelBuildError
from aenv.storage.rootfs import RootfsError
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


async def _base(cfg: config_mod.Config, minimal_base: bool, force: bool,
                say: Callable[[str], None]) -> None:
    """`base`: the minimal Debian itself, or the familiar build on it (images.bases)."""
    if minimal_base:
        await _in_runtime(cfg, lambda rt: bases.minimal(rt, bases.FAMILIAR, force, say))
        return

    async def first(rt: Runtime) -> bases.FamiliarPlan | None:
        await bases.minimal(rt, bases.MINIMAL, force, say)
        return await asyncio.to_thread(bases.plan_familiar, rt, force, say)

    plan = await _in_runtime(cfg, first)
    try:
        if plan is not None:  # the build API needs a serving node: this host's, for a while
            log_file = cfg.run_dir / "familiar-build.log"
            say(f"building {bases.FAMILIAR} through the template build API (node log: "
                f"{log_file})")
            api_key = resolve_api_key(cfg)

            def build() -> None:
                with familiar.serving_node(log_file) as url:
                    familiar.build(plan.context, bases.FAMILIAR, url, api_key, say)

            await asyncio.to_thread(build)

        async def last(rt: Runtime) -> None:
            await asyncio.to_thread(bases.finish_familiar, rt, plan, say)

        await _in_runtime(cfg, last)
    finally:
        if plan is not None:
            plan.work.cleanup()


async def _setup(templates: list[str], force: bool, minimal_base: bool) -> None:
    cfg = config_mod.load()
    say, stop = build_progress()  # a spinner on a terminal, timestamped lines otherwise
    try:
        for spec in templates:
            name, _, recipe = spec.partition("=")
            if name == bases.FAMILIAR and not recipe:
                await _base(cfg, minimal_base, force, say)
                continue
            await _in_runtime(cfg, lambda rt, n=name, r=recipe: build_template(
                rt, n, r or n, progress=say, force=force))  # fmt: skip
    finally:
        stop()


def setup(
    template: list[str] = typer.Option(  # noqa: B008
        ["base"], "--template", "-t",
        help="NAME[=RECIPE] to build (recipes: debian, busybox; `base` alone: the familiar base)",
    ),
    force: bool = typer.Option(False, help="rebuild templates even if up to date"),
    minimal_base: bool = typer.Option(
        False, envvar="AENV_MINIMAL_BASE",
        help="make `base` the minimal Debian (quick; CI) instead of the familiar base built on it"),
) -> None:
    """Prepare this host: data filesystem, guest kernel, tools drive, templates."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the build polls its status
    try:
        asyncio.run(_setup(template, force, minimal_base))
    except (BuildError, KernelBuildError, RootfsError, DataFsError, VmmError, RegistryError,
            FamiliarError) as e:
        print(f"aenv setup: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
