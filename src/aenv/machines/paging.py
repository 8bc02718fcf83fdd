"""The pager: a node's guest memory as its VMMs hold it (architecture.md, "Guest memory").

One object the runtime composes (`Runtime.pager`), with what it works on given explicitly:
the running machines, the hot tier, and the runtime's wait for a machine's pending work. It
measures what VMMs hold, writes a stopped guest's written pages to its RAM file
(`vmm.ram`), reclaims idle ones (`reclaiming.py`) and makes room in the hot tier."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping

from aenv.machines import meter, reclaiming
from aenv.machines.hot import HotTier
from aenv.machines.machine import Machine
from aenv.vmm import ram


class Pager:
    def __init__(self, machines: Mapping[str, Machine], hot: HotTier,
                 settled: Callable[[Machine], Awaitable[None]]) -> None:
        self._machines = machines  # the runtime's running VMs, by sandbox (read only)
        self._hot = hot
        self._settled = settled

    # -- writing ---------------------------------------------------------------------------
    @staticmethod
    def write(m: Machine, *, remap: bool, durable: bool = True) -> ram.Saved:
        """The stopped guest's written pages into its RAM file (fsynced unless not
        `durable`); the VMM then maps them from there unless `remap` is false (blocking)."""
        spec = m.vm.spec
        saved = ram.save(m.vm.pid, spec.memory_file, spec.shape.memory_mib << 20, durable)
        if remap:
            ram.remap(m.vm.pid, spec.memory_file, saved)
        return saved

    async def reclaim(self, name: str) -> reclaiming.Reclaimed:
        """An idle running sandbox hands back the memory its guest wrote (reclaiming.py)."""
        m = self._machines[name]
        await self._settled(m)
        return await reclaiming.reclaim(m)

    # -- measuring -------------------------------------------------------------------------
    def vmm_pss(self) -> dict[str, int]:
        """Each running sandbox's VMM's PSS, bytes (blocking: a read of /proc each)."""
        out = {}
        for name, m in list(self._machines.items()):
            with contextlib.suppress(OSError):
                out[name] = meter.process_pss(m.vm.pid)
        return out

    def cpu_seconds(self, name: str) -> float | None:
        """The CPU time a running sandbox's VMM has used so far (None: it runs none)."""
        m = self._machines.get(name)
        if m is None:
            return None
        try:
            return meter.process_cpu_s(m.vm.pid)
        except (OSError, ValueError, IndexError):
            return None

    def hot_pss(self) -> int:
        """What the hot VMMs hold in all, bytes (blocking)."""
        return self._hot.pss()

    def host_memory(self, name: str) -> meter.HostMemory | None:
        """What a running sandbox's VMM holds (None when it runs none)."""
        m = self._machines.get(name)
        if m is None:
            return None
        try:
            return meter.host_memory(m.vm.pid, m.vm.spec.memory_file)
        except OSError:
            return None

    # -- room --------------------------------------------------------------------------------
    async def make_room(self, new_mib: int) -> None:
        """Demote hot VMMs, oldest first, while the node's memory budget lacks `new_mib`
        beside what the running VMMs hold (measured: with overcommit their nominal RAM may
        pass the budget). With no hot VMM there is nothing to demote, nor to measure."""
        if not self._hot.names():
            return
        held = await asyncio.to_thread(self.vmm_pss)
        await self._hot.make_room(sum(held.values()) >> 20, new_mib)
