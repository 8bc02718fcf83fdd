"""The hot pause tier: paused sandboxes whose stopped VMM the node keeps.

A full pause saves device state and makes RAM and disk durable exactly as a cold one does;
the paused state on disk is complete either way. A hot pause then keeps the stopped QEMU and
its slot, so a resume is a QMP `cont`: no restore and, under TCG, no re-translation of guest
code (the translation cache lives in the process). After `hot_release_delay_s` the guest's
RAM pages are handed back to the host (`vmm.memory.page_out`; they are clean, so nothing is
written), and the pages that were resident are recorded so that a resume reads them back in
ahead of the guest (`prefetch`).

Hot becomes cold, the VMM ended and only the files kept, on the age limit, beyond the hot
budget (count, resident memory), under host memory pressure (PSI), when a create needs the
memory, at shutdown, and when the VMM dies. None of these loses anything: the paused state
on disk is what a cold resume restores. A node that dies leaves hot VMMs without a node; the
next one reclaims them (`reclaim`) and their sandboxes resume cold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aenv.config import Config
from aenv.machines import meter
from aenv.obs import HOT_DEMOTIONS, HOT_RSS, HOT_VMS, log_event
from aenv.vmm import memory, ram

if TYPE_CHECKING:
    from aenv.machines.machine import Machine

log = logging.getLogger(__name__)

TICK_S = 1.0  # how often age, budget and pressure are looked at
PSI_FILE = Path("/proc/pressure/memory")


@dataclass
class HotVm:
    machine: Machine
    paused_at: float = field(default_factory=time.monotonic)
    released: bool = False
    # At release: the RAM runs that were resident, read back in at resume.
    runs: list[tuple[int, int]] = field(default_factory=list)
    rss: int = 0  # the process's resident bytes when last looked at
    release: asyncio.TimerHandle | None = None
    releasing: asyncio.Task[None] | None = None
    # The pause's save: its VMM still holds the written pages as its own (anonymous)
    # memory until the release rebases it onto its RAM file (vmm/ram.py).
    saved: ram.Saved | None = None
    broken: bool = False  # a rebase failed: its RAM is not to be trusted, its files are

    @property
    def pid(self) -> int:
        return self.machine.vm.pid


def psi_some_avg10(path: Path = PSI_FILE) -> float:
    """Share (%) of the last 10 s in which some task waited on memory; 0 without PSI."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("some "):
                return float(line.split("avg10=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        pass
    return 0.0


def host_memory_mib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) >> 10
    return 0


def memory_budget_mib(cfg: Config) -> int:
    """A node's memory budget for sandboxes (`memory_budget_mib`, else the host's memory
    less 2 GiB for itself)."""
    return cfg.memory_budget_mib or max(host_memory_mib() - 2048, 1024)


class HotTier:
    """Which paused sandboxes keep their VMM, and when each one stops keeping it.
    `demote(machine, reason)` ends a VMM the tier let go (the runtime's)."""

    def __init__(self, cfg: Config, demote: Callable[[Machine], Awaitable[None]]) -> None:
        self.cfg = cfg
        self._demote_vm = demote
        self._hot: dict[str, HotVm] = {}  # oldest first
        self._keeper: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Task[None]] = set()
        self._ending: dict[str, asyncio.Event] = {}  # demotions under way

    @property
    def enabled(self) -> bool:
        return self.cfg.hot_pause_s > 0 and self.cfg.hot_pause_max > 0

    def __contains__(self, name: str) -> bool:
        return name in self._hot

    def names(self) -> set[str]:
        return set(self._hot)

    def oldest(self, but: str | None = None) -> str | None:
        """The sandbox paused hot longest ago (other than `but`): the first to go cold."""
        return next((n for n in self._hot if n != but), None)

    def pss(self) -> int:
        """What the hot VMMs hold in all, bytes (PSS; blocking)."""
        total = 0
        for h in list(self._hot.values()):
            with contextlib.suppress(OSError):
                total += meter.process_pss(h.pid)
        return total

    def get(self, name: str) -> HotVm | None:
        return self._hot.get(name)

    def start(self) -> None:
        if self.enabled and self._keeper is None:
            self._keeper = asyncio.get_running_loop().create_task(self._keep(), name="aenv-hot")

    async def close(self) -> None:
        """Node shutdown: every hot VMM becomes cold."""
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        await asyncio.gather(*(self.demote(n, "shutdown") for n in list(self._hot)))

    # -- in and out ----------------------------------------------------------------------
    async def keep(self, m: Machine, saved: ram.Saved | None = None) -> None:
        """`m` (stopped, its paused state durable) stays hot; the oldest others go cold
        if the budget is exceeded now."""
        h = HotVm(m, saved=saved)
        with contextlib.suppress(OSError):
            h.rss = memory.process_rss(h.pid)
        self._hot[m.name] = h
        delay = self.cfg.hot_release_delay_s
        h.release = asyncio.get_running_loop().call_later(delay, self._start_release, m.name, h)
        await self._enforce_budget()
        self._gauges()

    def take(self, name: str) -> HotVm | None:
        """Out of the tier for a resume (the caller continues or ends its VMM)."""
        h = self._hot.pop(name, None)
        if h is not None and h.release is not None:
            h.release.cancel()
        self._gauges()
        return h

    async def demote(self, name: str, reason: str) -> bool:
        """End the sandbox's hot VMM (its paused files stay). One that another call is
        demoting is waited for: a cold resume must not start a jail of the same name while
        the old one is still being torn down. False when it was not hot."""
        h = self.take(name)
        if h is None:
            await self.ended(name)
            return False
        HOT_DEMOTIONS.labels(reason).inc()
        log_event(log, "sandbox.demoted", sandbox_id=name, reason=reason,
                  hot_s=round(time.monotonic() - h.paused_at, 1))  # fmt: skip
        self._ending[name] = ending = asyncio.Event()
        try:
            await self._demote_vm(h.machine)
        finally:
            ending.set()
            self._ending.pop(name, None)
        return True

    async def ended(self, name: str) -> None:
        """Once a demotion of `name` under way, if any, has ended its VMM."""
        if (ending := self._ending.get(name)) is not None:
            await ending.wait()

    def forget(self, name: str) -> HotVm | None:
        """Its VMM is gone already (died, killed): out of the tier without a demotion."""
        return self.take(name)

    # -- memory --------------------------------------------------------------------------
    def _start_release(self, name: str, h: HotVm) -> None:
        if self._hot.get(name) is not h:
            return
        t = h.releasing = asyncio.get_running_loop().create_task(self._release(name, h))
        self._releases.add(t)
        t.add_done_callback(self._releases.discard)

    async def _release(self, name: str, h: HotVm) -> None:
        try:
            await asyncio.to_thread(release, h)
        except ram.RamError as e:  # its RAM may be half rebased: only the files are sure
            h.broken = True
            log.warning("rebasing the RAM of hot %s failed: %s", name, e)
            if self._hot.get(name) is h:
                await self.demote(name, "error")
        except OSError as e:  # its VMM ended meanwhile: its watcher reports that
            log.info("releasing the RAM of hot %s failed: %s", name, e)
        self._gauges()

    def resident_mib(self) -> int:
        return sum(h.rss for h in self._hot.values()) >> 20

    def memory_budget_mib(self) -> int:
        """The node's memory budget for sandboxes: running VMs' RAM plus hot VMMs' RSS."""
        return memory_budget_mib(self.cfg)

    async def make_room(self, committed_mib: int, new_mib: int) -> None:
        """Demote the oldest hot VMMs while `committed_mib` (what running VMMs hold) + the
        hot VMMs' resident memory + `new_mib` is over the node's memory budget."""
        budget = self.memory_budget_mib()
        while self._hot and committed_mib + self.resident_mib() + new_mib > budget:
            await self.demote(next(iter(self._hot)), "memory")

    async def _enforce_budget(self) -> None:
        while len(self._hot) > self.cfg.hot_pause_max or (
                self._hot and self.resident_mib() > self.cfg.hot_pause_memory_mib):
            await self.demote(next(iter(self._hot)), "budget")

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self._tick()
            except Exception:
                log.exception("hot tier tick failed")

    async def _tick(self) -> None:
        now = time.monotonic()
        for name, h in list(self._hot.items()):
            if now - h.paused_at >= self.cfg.hot_pause_s:
                await self.demote(name, "age")
            else:
                with contextlib.suppress(OSError):
                    h.rss = await asyncio.to_thread(memory.process_rss, h.pid)
        if self._hot and psi_some_avg10() > self.cfg.hot_psi_avg10:
            await self.demote(next(iter(self._hot)), "pressure")  # one a tick while it lasts
        await self._enforce_budget()
        self._gauges()

    def _gauges(self) -> None:
        HOT_VMS.set(len(self._hot))
        HOT_RSS.set(sum(h.rss for h in self._hot.values()))


async def released(h: HotVm) -> None:
    """Wait for a release under way (taken out of the tier, `h` gets no new one): it must
    not rebase a VMM that runs again. One that failed has its VMM ended."""
    if h.releasing is not None:
        with contextlib.suppress(Exception):
            await asyncio.shield(h.releasing)
    if h.broken:
        raise ram.RamError(f"the hot VMM of {h.machine.name} failed its rebase")


def release(h: HotVm) -> None:
    """Map the guest's written pages from its RAM file (the pause wrote them there), record
    which guest pages are resident, then drop them from the VMM (blocking)."""
    if h.saved is not None:
        ram.remap(h.pid, h.machine.vm.spec.memory_file, h.saved)
        h.saved = None
    m = _region(h)
    h.runs = memory.resident_runs(m)
    memory.page_out(m)
    h.released = True
    h.rss = memory.process_rss(h.pid)


def page_in(h: HotVm) -> None:
    """Read back what `release` dropped, ahead of the continue (blocking)."""
    if h.released and h.runs:
        memory.prefetch(_region(h), h.runs)


def _region(h: HotVm) -> memory.RamMapping:
    """Its guest RAM: the VMAs of its base and its own RAM file (vmm/ram.py)."""
    return ram.mapping(h.pid, h.machine.vm.spec.memory_file)
