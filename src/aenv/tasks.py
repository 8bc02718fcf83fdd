"""Small asyncio helpers shared by the planes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine


async def cancel(task: asyncio.Task[None] | None) -> None:
    """Cancel `task` (if any) and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class TaskSet:
    """Background tasks an object starts and must end when it closes: each is kept (asyncio
    holds only a weak reference) until it is done."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[object, object, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Cancel every task and wait until each has ended (whatever it raised)."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
