"""Per-sandbox serialisation: one asyncio lock per sandbox id, and joining of equal calls.

Every operation that changes a sandbox's state holds that sandbox's lock from its first CAS
to its last, so a second call on the same sandbox waits for the in-flight transition and then
acts on the state it left (bounded by `transition_wait_s`). A second call of the *same*
operation (two kills) joins the first and gets its result instead of queueing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from aenv.orchestrator.errors import StateConflict

T = TypeVar("T")


class SandboxLocks:
    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    def locked(self, sandbox_id: str) -> bool:
        entry = self._locks.get(sandbox_id)
        return entry is not None and entry[0].locked()

    @contextlib.asynccontextmanager
    async def hold(self, sandbox_id: str) -> AsyncIterator[None]:
        lock, refs = self._locks.setdefault(sandbox_id, (asyncio.Lock(), [0]))
        refs[0] += 1
        try:
            try:
                async with asyncio.timeout(self.wait_s):
                    await lock.acquire()
            except TimeoutError:
                raise StateConflict(
                    f"another operation on sandbox {sandbox_id} is still in progress"
                ) from None
            try:
                yield
            finally:
                lock.release()
        finally:
            refs[0] -= 1
            if refs[0] == 0:
                self._locks.pop(sandbox_id, None)

    def __len__(self) -> int:
        return len(self._locks)


class Joiner:
    """Runs at most one `(sandbox_id, op)` at a time; concurrent callers share its outcome."""

    def __init__(self) -> None:
        self._inflight: dict[tuple[str, str], asyncio.Future[Any]] = {}

    def inflight(self, sandbox_id: str, op: str) -> bool:
        return (sandbox_id, op) in self._inflight

    async def run(self, sandbox_id: str, op: str, fn: Callable[[], Awaitable[T]]) -> T:
        key = (sandbox_id, op)
        fut = self._inflight.get(key)
        if fut is not None:
            return await asyncio.shield(fut)
        fut = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            result = await fn()
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                fut.cancel()
            else:
                fut.set_exception(e)
                fut.exception()  # mark retrieved: joiners re-raise it, the first caller too
            raise
        else:
            fut.set_result(result)
            return result
        finally:
            self._inflight.pop(key, None)
