"""The node-wide gate of fork children's `/init`s, pushed behind the fork call.

Under TCG each child's first `/init` translates the agent's code anew: 64 children at once
on 2 cores took ~14 s each, four at a time, so the last waited minutes for its turn. A
request for a child that is not ready yet (the data plane holds it) moves that child ahead
of those nobody asked for: a trainer that uses some children first gets them first.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator


class InitGate:
    """At most `n` holders at once; a waiter `hurry`-ed goes before the others, each group
    first come, first served."""

    def __init__(self, n: int) -> None:
        self._free = max(1, n)
        self._order = itertools.count()
        self._waiting: dict[str, tuple[int, int, asyncio.Future[None]]] = {}  # name -> key

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        if self._free > 0 and not self._waiting:
            self._free -= 1
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting[name] = (1, next(self._order), fut)
            try:
                await fut
            except BaseException:
                if self._waiting.pop(name, None) is None and fut.done() and not fut.cancelled():
                    self._release()  # it was handed the slot as it was cancelled
                raise
        try:
            yield
        finally:
            self._release()

    def hurry(self, name: str) -> None:
        """`name`'s turn comes before those nobody asked for (no-op if it is not waiting)."""
        if (w := self._waiting.get(name)) is not None and w[0]:
            self._waiting[name] = (0, w[1], w[2])

    def _release(self) -> None:
        if not self._waiting:
            self._free += 1
            return
        name = min(self._waiting, key=lambda k: self._waiting[k][:2])
        self._waiting.pop(name)[2].set_result(None)  # its slot passes on as it is
