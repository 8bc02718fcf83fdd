"""VMs a node makes ahead of time so that a create or resume does not wait for them; the
runtime (`runtime.Runtime`) says how one is made and ended, a pool keeps `size` of them for
one key and refills in the background.

- The **warm pool**: `-incoming defer` QEMUs with their slots and empty files, for the
  default template's machine key: a restore of any snapshot of that shape costs the clone
  and the device-state load, not QEMU start-up.
- The **primed pool**: default-template VMs already restored, run until their agent has
  answered, then stopped (`Runtime.prime`): a create from the default template continues
  one and pushes its `/init`.
- The **primed snapshot pools** (`RecentPools`): the same for the user snapshots creates
  used most recently (a task's start state that a GRPO group creates from again and again),
  within one budget of VMs: each older snapshot keeps one, the newest the rest.

A pooled VM has no record: it is named `pool-*` (census.UNRECORDED_VMS), and a restarted
node reclaims what an earlier process pooled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from aenv.obs import POOLED_VMS, VMM_EXITS

if TYPE_CHECKING:
    from aenv.machines.api import VmmExit
    from aenv.machines.machine import Machine

log = logging.getLogger(__name__)

RESPAWN_DELAY_S = 1.0  # after a pooled VMM died on its own
K = TypeVar("K")


class VmPool(Generic[K]):
    """Up to `size` ready VMs for one key (set by `configure`), refilled as they are
    taken. `make(key)` builds one (raising on failure), `destroy` ends one, `watch(m, died)`
    calls `died` if m's VMM ends on its own."""

    def __init__(self, kind: str, size: int, make: Callable[[K], Awaitable[Machine]],
                 destroy: Callable[[Machine], Awaitable[None]],
                 watch: Callable[[Machine, Callable[[Machine, VmmExit], None]], None],
                 refill_delay_s: float = 0.0,
                 on_count: Callable[[], None] | None = None) -> None:
        self.kind = kind  # "warm_pool" | "primed_pool": logs and the VMM-exit metric
        self.size = size
        self.key: K | None = None
        self._make, self._destroy, self._watch = make, destroy, watch
        self._ready: list[Machine] = []
        self._making = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._drops: set[asyncio.Task[None]] = set()  # releasing VMMs that died pooled
        self._closed = False
        # After a take: wait this long before making the replacement, so that making it
        # does not compete for the CPU with the start of the VM just taken.
        self.refill_delay_s = refill_delay_s
        self._delayed: asyncio.TimerHandle | None = None
        self._on_count = on_count  # instead of this pool's own gauge (RecentPools)

    def configure(self, key: K) -> None:
        self.key = key
        self._refill()

    def resize(self, size: int) -> None:
        """Keep `size` VMs from now on: extra ready ones go at once, missing ones are made
        after the refill delay (not while the create that asked for them starts)."""
        self.size = size
        extra, self._ready = self._ready[size:], self._ready[:size]
        self._count()
        for m in extra:
            self._drop(m)
        self._later_refill()

    def _drop(self, m: Machine) -> None:
        if m.watcher is not None:
            m.watcher.cancel()
        t = asyncio.get_running_loop().create_task(self._destroy(m))
        self._drops.add(t)
        t.add_done_callback(self._drops.discard)

    def _later_refill(self) -> None:
        if self.refill_delay_s <= 0:
            self._refill()
        elif self._delayed is None:
            self._delayed = asyncio.get_running_loop().call_later(
                self.refill_delay_s, self._delayed_refill)

    def names(self) -> set[str]:
        return {m.name for m in self._ready}

    def __len__(self) -> int:
        return len(self._ready)

    def take(self, key: K) -> Machine | None:
        if key != self.key or not self._ready:
            return None
        m = self._ready.pop(0)
        self._count()
        if m.watcher is not None:
            m.watcher.cancel()  # the sandbox it becomes is watched from then on
        self._later_refill()
        return m

    def _delayed_refill(self) -> None:
        self._delayed = None
        self._refill()

    def _refill(self) -> None:
        if self._closed or self.key is None:
            return
        while len(self._ready) + self._making < self.size:
            self._making += 1
            t = asyncio.get_running_loop().create_task(self._fill(self.key))
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _fill(self, key: K) -> None:
        try:
            m = await self._make(key)
            if self._closed or key != self.key or len(self._ready) >= self.size:
                await self._destroy(m)  # closed, another key, or shrunk meanwhile
            else:
                self._ready.append(m)
                self._count()
                self._watch(m, self._died)
        except Exception as e:  # a failed refill must not break the node; next take refills
            log.warning("%s: making a VM failed: %s", self.kind, e)
        finally:
            self._making -= 1

    def _died(self, m: Machine, how: VmmExit) -> None:
        """A pooled VMM ended on its own: drop it, release its slot, jail and files, and
        make a replacement a little later."""
        if m not in self._ready:
            return  # taken meanwhile: whoever took it finds it dead and fails
        self._ready.remove(m)
        self._count()
        VMM_EXITS.labels(self.kind).inc()
        loop = asyncio.get_running_loop()

        async def drop() -> None:
            try:
                await self._destroy(m)
            finally:
                loop.call_later(RESPAWN_DELAY_S, self._refill)

        t = loop.create_task(drop(), name=f"aenv-{self.kind}-drop-{m.name}")
        self._drops.add(t)
        t.add_done_callback(self._drops.discard)

    def _count(self) -> None:
        if self._on_count is not None:
            self._on_count()
        else:
            POOLED_VMS.labels(self.kind).set(len(self._ready))

    async def settle(self) -> None:
        """Wait for the VMs being made (they are then in `names()`)."""
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        self._closed = True
        if self._delayed is not None:
            self._delayed.cancel()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, *self._drops, return_exceptions=True)
        ready, self._ready = self._ready, []
        self._count()
        await asyncio.gather(*(self._destroy(m) for m in ready))


class RecentPools(Generic[K]):
    """Primed VMs for the keys used most recently, within one budget of `size` VMs: each
    of the older keys (at most `size - 1` of them) keeps one VM, the newest the rest. A
    key that falls out, or is forgotten (its snapshot deleted), has its VMs ended."""

    def __init__(self, kind: str, size: int, make: Callable[[K], Awaitable[Machine]],
                 destroy: Callable[[Machine], Awaitable[None]],
                 watch: Callable[[Machine, Callable[[Machine, VmmExit], None]], None],
                 refill_delay_s: float = 0.0) -> None:
        self.kind, self.size = kind, size
        self._args = (make, destroy, watch)
        self._refill_delay_s = refill_delay_s
        self._pools: dict[K, VmPool[K]] = {}  # oldest first
        self._retiring: set[asyncio.Task[None]] = set()

    def use(self, key: K) -> None:
        """`key` was just used: it becomes the newest, and the budget is shared again."""
        if self.size <= 0:
            return
        pool = self._pools.pop(key, None)
        if pool is None:
            pool = VmPool(self.kind, 0, *self._args, refill_delay_s=self._refill_delay_s,
                          on_count=self._count)
            pool.key = key
        self._pools[key] = pool
        while len(self._pools) > self.size:
            self._retire(self._pools.pop(next(iter(self._pools))))
        self._share()

    def _share(self) -> None:
        if not self._pools:
            return
        newest = next(reversed(self._pools))
        for k, p in self._pools.items():
            want = self.size - (len(self._pools) - 1) if k == newest else 1
            if p.size != want:
                p.resize(want)

    def forget(self, key: K) -> None:
        """End `key`'s VMs (on the event loop, as every pool method)."""
        pool = self._pools.pop(key, None)
        if pool is not None:
            self._retire(pool)
            self._share()  # the newest gets the share that was freed

    def _retire(self, pool: VmPool[K]) -> None:
        t = asyncio.get_running_loop().create_task(pool.close())
        self._retiring.add(t)
        t.add_done_callback(self._retiring.discard)
        self._count()

    def take(self, key: K) -> Machine | None:
        pool = self._pools.get(key)
        return pool.take(key) if pool is not None else None

    def keys(self) -> list[K]:
        return list(self._pools)

    def names(self) -> set[str]:
        return set().union(*(p.names() for p in self._pools.values()))

    def __len__(self) -> int:
        return sum(len(p) for p in self._pools.values())

    def _count(self) -> None:
        POOLED_VMS.labels(self.kind).set(len(self))

    async def settle(self) -> None:
        await asyncio.gather(*(p.settle() for p in list(self._pools.values())))

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        await asyncio.gather(*(p.close() for p in pools), *self._retiring)
        self._count()
