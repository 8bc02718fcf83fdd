"""A template from a recipe (`storage.recipes`), as `aenv setup -t NAME=RECIPE` and
`aenv template build NAME --recipe RECIPE` make it: its root filesystem booted and
snapshotted (`orchestrator.builder`), then, for a recipe with a start command, snapshotted
again with the command running and ready (`finalize`), so its sandboxes start warm."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from aenv.config import MachineShape
from aenv.images import finalize
from aenv.orchestrator.builder import BuildError, build_template
from aenv.storage.recipes import RECIPES
from aenv.storage.templates import Template


async def build(rt: Any, name: str, recipe: str, shape: MachineShape | None = None,
                progress: Callable[[str], None] = print, force: bool = False) -> Template:
    """Template `name` from `recipe` (in the recipe's shape unless `shape` is given)."""
    known = RECIPES.get(recipe)
    if known is None:
        raise BuildError(f"unknown recipe {recipe!r} (known: {', '.join(RECIPES)})")
    t = await build_template(rt, name, recipe, shape or known.shape, progress=progress,
                             force=force)  # fmt: skip
    if known.start_cmd is None or t.start_cmd == known.start_cmd:
        return t
    try:
        return await finalize.with_start_cmd(rt, t, known.start_cmd, known.ready_cmd,
                                             progress, user=known.start_user)  # fmt: skip
    except BaseException:
        # Never a template without what it is for: the next setup makes it again.
        with contextlib.suppress(Exception):
            rt.remove_template(name)
            rt.delete_snapshot(t.snapshot_id)
        raise
