"""Re-attaching to the VMs an earlier node process left running (node restart)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from aenv.machines import adoption
from aenv.machines.api import (
    SandboxHandle,
)
from aenv.machines.machine import (
    ADOPT_AGENT_TIMEOUT,
    ADOPT_VMM_TIMEOUT,
    Machine,
)
from aenv.network.pool import SlotPoolError
from aenv.vmm import jail
from aenv.vmm.qemu import QemuVm

log = logging.getLogger(__name__)

class Adopting:
    """Part of `Runtime` (machines/runtime.py), whose state it uses."""

    async def adopt(self, handles: list[SandboxHandle]) -> list[SandboxHandle]:
        """Re-attach to the VMs an earlier node process left running for these sandboxes
        (node restart, see `recovery`): those whose adoption record, processes, slot, QMP
        and agent all check out. What is not adopted is left to `reclaim`."""
        results = await asyncio.gather(*(self._adopt(h) for h in handles),
                                       return_exceptions=True)
        adopted = []
        for h, r in zip(handles, results, strict=True):
            if isinstance(r, SandboxHandle):
                adopted.append(r)
            elif isinstance(r, Exception):
                log.info("sandbox %s not adopted: %s", h.sandbox_id, r)
            else:
                raise r
        return adopted

    async def _adopt(self, h: SandboxHandle) -> SandboxHandle:
        name = h.sandbox_id
        workdir = self.cfg.sandboxes_dir / name
        t0 = time.perf_counter()
        rec = await asyncio.to_thread(adoption.read, workdir)
        if rec.sandbox_id != name or rec.slot_addr != h.slot_addr or name in self._machines:
            raise adoption.NotAdoptable("its adoption record names another sandbox or slot")
        real = workdir.resolve()  # a pooled VM's directory: its jail is named after it
        jailed = await asyncio.to_thread(jail.adopt, self.driver.jail_prefix + real.name,
                                         rec.jail, self.slots.uid_for_index(rec.slot_index))
        if jailed is None:
            raise adoption.NotAdoptable("its VMM is gone (or is not the process recorded)")
        # From here on it is provably this sandbox's VM: a failure ends it at once.
        try:
            slot = await asyncio.to_thread(self.slots.adopt, rec.slot_index)
        except BaseException:
            await jailed.kill()
            raise
        try:
            if slot.slot_addr != rec.slot_addr:
                raise SlotPoolError(f"slot {slot.netns} is at {slot.slot_addr} now")
            spec = self._spec(slot, real, rec.shape, Path(rec.kernel), Path(rec.tools),
                              rec.cmdline)
            t1 = time.perf_counter()
            vm: QemuVm = await asyncio.wait_for(self.driver.adopt(spec, jailed),
                                                ADOPT_VMM_TIMEOUT)
        except BaseException:
            await jailed.kill()
            await self.slots.release_async(slot)
            raise
        m = Machine(name, vm, slot, workdir, rec.template_id, jail=real.name,
                    access_token=rec.access_token)
        self._register(m)
        try:
            t2 = time.perf_counter()
            await self.wait_agent(m, ADOPT_AGENT_TIMEOUT)
        except BaseException:
            await self._stop(m)
            raise
        log.debug("adopt %s: checks+slot=%.1fms qmp=%.1fms agent=%.1fms", name,
                  (t1 - t0) * 1e3, (t2 - t1) * 1e3, (time.perf_counter() - t2) * 1e3)
        return self.handle(name, h.template_id)

    def _adoption_record(self, m: Machine) -> adoption.AdoptionRecord:
        vm = m.vm
        assert isinstance(vm, QemuVm)
        man = self._manifest_of(m, "")  # the machine as a snapshot of it would name it
        return adoption.AdoptionRecord(
            sandbox_id=m.name, template_id=m.template_id, slot_index=m.slot.index,
            slot_addr=m.slot.slot_addr, shape=man.shape, kernel=man.kernel, tools=man.tools,
            cmdline=man.cmdline, jail=vm.identity(), access_token=m.access_token,
        )
