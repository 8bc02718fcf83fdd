"""`max_concurrent_boots`, and the bounded queue in front of it (docs/api.md, "Admission").

A burst of creates (a trainer's GRPO step: 64 at once) is more than a node boots at once, but
not more than it runs: what it cannot start at once waits here, up to `admission_queue_s`,
for a boot to end, and only then is refused (429 with `Retry-After`, which the SDK retries).
Waiting is woken by every boot that ends; whoever runs first after that takes the place (no
await lies between a wait's end and the caller's admission, so the count stays exact).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from aenv.obs import ADMISSION_WAIT, BOOTS_IN_FLIGHT


class BootSlots:
    def __init__(self, limit: int, queue_s: float) -> None:
        self.limit = limit
        self.queue_s = queue_s
        self.in_flight = 0
        self.waiting = 0
        self._freed = asyncio.Event()

    @property
    def full(self) -> bool:
        return self.in_flight >= self.limit

    async def wait(self) -> None:
        """Until a boot may start, or `queue_s` has passed (the caller's admission then
        refuses). Returns at once when there is room."""
        if not self.full:
            return
        t0 = time.monotonic()
        deadline = t0 + self.queue_s
        self.waiting += 1
        try:
            while self.full and (left := deadline - time.monotonic()) > 0:
                freed = self._freed
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await freed.wait()
        finally:
            self.waiting -= 1
            ADMISSION_WAIT.observe(time.monotonic() - t0)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """One boot in flight (and in the gauge) while the block runs."""
        self.in_flight += 1
        BOOTS_IN_FLIGHT.inc()
        try:
            yield
        finally:
            self.in_flight -= 1
            BOOTS_IN_FLIGHT.dec()
            self._freed.set()  # every waiter looks again; a new event for the next round
            self._freed = asyncio.Event()
