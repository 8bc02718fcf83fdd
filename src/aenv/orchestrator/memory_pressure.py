"""Memory pressure on a node (docs/runtime.md, "Guest memory"): what its VMMs hold,
measured; and, before admission refuses work for memory, in this order: idle running
sandboxes hand back what their guests wrote, then the oldest hot VMMs become cold. Only
then does a create, resume or fork get its 429 (`memory_admission.py`)."""

from __future__ import annotations

import asyncio
import logging
import time

from aenv.machines.paging import Pager
from aenv.obs import SANDBOX_MEMORY, log_event
from aenv.orchestrator.node import Node
from aenv.orchestrator.routes import Route
from aenv.orchestrator.states import HOLDS_CAPACITY

log = logging.getLogger("aenv.orchestrator")

MIB = 1 << 20
# Under pressure a sandbox with no request for this long is reclaimed at once, before its
# reclaim_idle_s is up.
PRESSURE_IDLE_S = 5.0
# A measurement that says "short" and is older than this is taken again before pressure is
# relieved.
FRESH_S = 2.0
# A guest whose VMM uses more than this share of one core is busy, requests or not. An idle
# guest's VMM under TCG uses ~1-3% (its timers); one running a job, 100%.
IDLE_CPU = 0.15


async def measure(orch: Node) -> None:
    """What the running VMMs hold and what hot VMMs hold (the runtime's pager), for memory
    admission and /metrics."""
    pager = pager_of(orch)
    if pager is None:
        return
    pss = await asyncio.to_thread(pager.vmm_pss)
    kept = await asyncio.to_thread(pager.hot_pss)
    orch.memory.record(list(pss.values()), kept)
    SANDBOX_MEMORY.set(sum(pss.values()))


def pager_of(orch: Node) -> Pager | None:
    """The runtime's pager (machines/paging.py); a fake runtime has none."""
    pager = getattr(orch.runtime, "pager", None)
    return pager if isinstance(pager, Pager) else None


def reclaimable(orch: Node, route: Route, idle_s: float, now: float) -> bool:
    """Idle: no data-plane request for `idle_s`, none open, and its VMM (the guest) used
    under IDLE_CPU of a core over the reclaimer's last round (a job running on its own
    would only fault its pages straight back)."""
    return not (route.streams or route.reclaimed or now - route.last_active < idle_s
                or route.cpu_rate > IDLE_CPU
                or orch._locks.locked(route.sandbox_id) or orch._closing)  # fmt: skip


def note_cpu(orch: Node, route: Route, now: float) -> None:
    """Its VMM's CPU use since the last reading (`route.cpu_rate`)."""
    pager = pager_of(orch)
    cpu = pager.cpu_seconds(route.sandbox_id) if pager is not None else None
    if cpu is None:
        return
    mark, route.cpu_mark = route.cpu_mark, (now, cpu)
    if mark is not None and now > mark[0]:
        route.cpu_rate = max(0.0, cpu - mark[1]) / (now - mark[0])


async def reclaim(orch: Node, route: Route, why: str) -> bool:
    """Have the runtime take back what the route's (idle) sandbox wrote; once per idle
    spell: its next request clears `route.reclaimed`. False when it was busy or gone."""
    sid = route.sandbox_id
    try:
        async with orch._locks.hold(sid):
            if orch.routes.get(sid) is not route or route.streams:
                return False
            pager = pager_of(orch)
            assert pager is not None
            r = await pager.reclaim(sid)
        route.reclaimed = True
        log_event(log, "sandbox.reclaimed", sandbox_id=sid, reason=why,
                  written_mib=round(r.written / MIB, 1),
                  resident_mib=round(r.resident_before / MIB, 1),
                  after_mib=round(r.resident_after / MIB, 1),
                  stopped_ms=round(r.stopped_ms, 1))  # fmt: skip
        return True
    except Exception as e:  # it stays as it was: tried again after its next request
        route.reclaimed = True
        log_event(log, "sandbox.reclaim_failed", logging.WARNING, sandbox_id=sid,
                  error=str(e))  # fmt: skip
        return False


async def relieve(orch: Node, new_mib: int, vms: int = 1, *, keep: str | None = None
                  ) -> None:
    """Make room for `vms` sandboxes of `new_mib` MiB in all when what the node holds would
    refuse them: reclaim idle sandboxes (most idle first), then demote hot VMMs (oldest
    first; not `keep`, the sandbox the caller resumes or forks), measuring after each.
    Best effort: admission decides after."""
    if vms <= 0 or pager_of(orch) is None:
        return

    def short() -> bool:
        running = orch.store.count(HOLDS_CAPACITY)
        return orch.memory.short_of(running=running, vms=vms, new_mib=new_mib) is not None

    if not short():
        return  # the common case: no measurement on the way of a create
    m = orch.memory.measured
    if m is None or time.monotonic() - m.at > FRESH_S:
        await measure(orch)
        if not short():
            return
    if orch.config.reclaim_idle_s > 0:
        now = time.monotonic()
        for r in orch.routes:
            note_cpu(orch, r, now)
        idle = sorted((r for r in orch.routes if reclaimable(orch, r, PRESSURE_IDLE_S, now)),
                      key=lambda r: r.last_active)  # fmt: skip
        for route in idle:
            if await reclaim(orch, route, "pressure"):
                await measure(orch)
                if not short():
                    return
    hot = getattr(orch.runtime, "hot", None)
    while hot is not None and (oldest := hot.oldest(keep)) is not None and short():
        await hot.demote(oldest, "memory")
        await measure(orch)
