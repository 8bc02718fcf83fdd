"""`aenv setup`: everything a node needs before it serves — the reflink data filesystem,
the guest kernel, the tools drive and the default template. Cached: a second run is quick.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import typer

from aenv import config as config_mod
from aenv.cli.output import build_progress
from aenv.machines.runtime import Runtime
from aenv.orchestrator.builder import BuildError, build_template
from aenv.orchestrator.reclaim import reclaim_runtime
from aenv.storage.datafs import DataFsError
from aenv.storage.kernel import KernelBuildError
from aenv.storage.rootfs import RootfsError
from aenv.vmm.base import VmmError


async def _setup(templates: list[str], force: bool) -> None:
    cfg = config_mod.load()
    rt = Runtime(cfg)
    say, stop = build_progress()  # a spinner on a terminal, timestamped lines otherwise
    await rt.start()
    try:
        await reclaim_runtime(rt)
        for spec in templates:
            name, _, recipe = spec.partition("=")
            await build_template(rt, name, recipe or ("debian" if name == "base" else name),
                                 progress=say, force=force)
    finally:
        stop()
        await rt.close()


def setup(
    template: list[str] = typer.Option(  # noqa: B008
        ["base"], "--template", "-t", help="NAME[=RECIPE] to build (recipes: debian, busybox)"
    ),
    force: bool = typer.Option(False, help="rebuild templates even if up to date"),
) -> None:
    """Prepare this host: data filesystem, guest kernel, tools drive, templates."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_setup(template, force))
    except (BuildError, KernelBuildError, RootfsError, DataFsError, VmmError) as e:
        print(f"aenv setup: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
