"""Idle reclaim: a running VM hands back the memory its guest wrote (docs/runtime.md,
"Guest memory").

Pages a guest writes are its VMM's anonymous memory, which a host without swap can never
reclaim. For a VM that has been idle a while the node moves them into its RAM file, exactly
as a save does (`vmm.ram.save`), maps that file in their place (`vmm.ram.remap`: the
snapshot's pages stay shared, the written ones are now clean page cache of its own file)
and drops that file's cache. The guest is stopped only for the write; the pages it touches
afterwards come back from the page cache, or the disk, as minor or major faults.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

from aenv.machines.machine import Machine
from aenv.vmm import memory, ram


@dataclass(frozen=True)
class Reclaimed:
    written: int  # bytes the guest had written since the last save, now in its RAM file
    resident_before: int  # bytes of guest RAM the VMM had mapped
    resident_after: int
    stopped_ms: float  # how long the guest's vCPUs were stopped


def _resident(pid: int, memory_file: os.PathLike[str]) -> int:
    r = ram.mapping(pid, memory_file)  # type: ignore[arg-type]
    return sum(n for _, n in memory.resident_runs(r))


def _write_and_drop(m: Machine) -> int:
    spec = m.vm.spec
    written = ram.save_and_remap(m.vm.pid, spec.memory_file, spec.shape.memory_mib << 20).written
    # Its own file's pages are clean (fsynced): out of the page cache too.
    fd = os.open(spec.memory_file, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return written


async def reclaim(m: Machine) -> Reclaimed:
    """Hand back what the (running, idle) VM's guest wrote. The caller holds the sandbox:
    no pause, snapshot or kill runs meanwhile."""
    spec = m.vm.spec
    before = await asyncio.to_thread(_resident, m.vm.pid, spec.memory_file)
    t0 = time.perf_counter()
    await m.vm.pause()
    try:
        written = await asyncio.to_thread(_write_and_drop, m)
    finally:
        await m.vm.resume()
    stopped = (time.perf_counter() - t0) * 1e3
    after = await asyncio.to_thread(_resident, m.vm.pid, spec.memory_file)
    return Reclaimed(written, before, after, stopped)
