"""A node's lease renewed from a thread of its own (cluster/membership.py keeps the lease).

A node fences (pauses every sandbox, serves nothing) once its lease went unrenewed for half
its TTL (cluster/node.py). Renewed from the node's event loop, a loop held for seconds is
enough: 16 clients forking 4 children each on 2 cores held one for 2-3 s at a time, the
renewal behind it took 2.4 s more, and the node fenced with etcd in reach. Here the renewal
has its own thread, event loop and etcd client, and it renews only while the node's loop
still turns (a heartbeat within `alive_s`): a node whose loop is stuck stops renewing and is
lost, or fences when its loop turns again, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable

from aenv.cluster.etcd import Etcd, EtcdError, EtcdUnavailable

log = logging.getLogger("aenv.cluster")

BEAT_S = 0.25  # how often the node's loop says it turns


class LeaseKeeper:
    """Renews lease `lease()` every `every_s` from a thread; `renewed(t)` records each
    renewal asked at monotonic `t`; `expired()`, a coroutine run on the node's loop,
    registers again when etcd says the lease is gone."""

    def __init__(self, make_etcd: Callable[[], Etcd], lease: Callable[[], int], *,
                 every_s: float, alive_s: float, renewed: Callable[[float], None],
                 expired: Callable[[], Awaitable[None]], retry_s: float) -> None:  # fmt: skip
        self._make_etcd = make_etcd
        self._lease = lease
        self.every_s = every_s
        self.alive_s = alive_s
        self._renewed = renewed
        self._expired = expired
        self._retry_s = retry_s
        self._beat = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._beating: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None  # the thread's

    def start(self) -> None:
        """From the node's event loop."""
        self._loop = asyncio.get_running_loop()
        self._tick()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()),
                                        name="aenv-lease", daemon=True)  # fmt: skip
        self._thread.start()

    def _tick(self) -> None:
        assert self._loop is not None
        self._beat = time.monotonic()
        self._beating = self._loop.call_later(BEAT_S, self._tick)

    async def stop(self) -> None:
        self._stop.set()
        if self._wake is not None:
            loop, wake = self._wake
            with contextlib.suppress(RuntimeError):  # its loop ended meanwhile
                loop.call_soon_threadsafe(wake.set)
        if self._beating is not None:
            self._beating.cancel()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)
            self._thread = None

    async def _run(self) -> None:
        etcd = self._make_etcd()
        wake = asyncio.Event()
        self._wake = (asyncio.get_running_loop(), wake)
        wait = self.every_s
        try:
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), wait)
                    break
                wait = self.every_s
                if (still := time.monotonic() - self._beat) > self.alive_s:
                    log.warning("the node's event loop has not turned for %.1f s: its lease is "
                                "not renewed", still)  # fmt: skip
                    continue
                try:
                    asked = time.monotonic()
                    if await etcd.keepalive(self._lease()) <= 0:
                        log.warning("the node's lease expired: registering again")
                        assert self._loop is not None
                        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                            self._expired(), self._loop))  # fmt: skip
                        continue
                    self._renewed(asked)
                    if (took := time.monotonic() - asked) > self.every_s:
                        log.warning("renewing the node's lease took %.1f s", took)
                except EtcdUnavailable as e:
                    log.warning("etcd unreachable (%s) renewing the node's lease", e)
                    wait = min(self._retry_s, self.every_s)
                except EtcdError as e:
                    log.warning("renewing the node's lease: %s", e)
                    wait = min(self._retry_s, self.every_s)
        finally:
            await etcd.aclose()
