"""Pause and resume of sandboxes (memory or filesystem only), the route a paused
sandbox's first request waits on, and the node-wide pauses: fencing and drain."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from aenv.faults import fault
from aenv.obs import OPS_TOTAL, log_event, stage
from aenv.orchestrator import memory_pressure
from aenv.orchestrator.errors import ShuttingDown, StateConflict, TeamLimitReached
from aenv.orchestrator.requests import agent_init
from aenv.orchestrator.routes import Route
from aenv.orchestrator.states import PUBLIC_STATE, SandboxState
from aenv.orchestrator.store import SandboxRecord

log = logging.getLogger("aenv.orchestrator")
S = SandboxState


class Pausing:
    """Part of `Orchestrator` (orchestrator/service.py), whose state it uses."""

    def _is_paused(self, sandbox_id: str) -> bool:
        return bool(self.runtime.is_paused(sandbox_id))

    async def pause(
        self, sandbox_id: str, memory: bool = True, require_healthy_guest: bool = False
    ) -> None:
        """Running -> Pausing -> Paused. StateConflict (409) if it is already paused.
        `memory=False`: filesystem-only (only the disk is kept; resuming reboots it).
        `require_healthy_guest`: GuestUnresponsive (503) and still running if the guest's
        agent does not answer."""
        async with self._locks.hold(sandbox_id):
            rec = self.get(sandbox_id)
            if rec.state is S.PAUSED:
                raise StateConflict(f"sandbox {sandbox_id} is already paused",
                                    actual=str(rec.state))  # fmt: skip
            # Refused before the VM stops once the reserve is gone (space.py: a pause needs
            # only the reserve). The node's own pauses (TTL, shutdown) still try.
            self._admit_space(0, "pause a sandbox", keep_running=False)
            await self._pause_locked(rec, "request", memory=memory,
                                     require_healthy_guest=require_healthy_guest)  # fmt: skip

    async def _pause_locked(self, rec: SandboxRecord, reason: str, *, memory: bool = True,
                            require_healthy_guest: bool = False) -> None:
        sid = rec.sandbox_id
        mode = "full" if memory else "filesystem"
        if not self.store.transition(sid, [S.RUNNING], S.PAUSING, self.now_us(),
                                     pause_mode=mode):  # fmt: skip
            raise StateConflict(f"sandbox {sid} changed state", actual=str(rec.state))
        t0 = time.perf_counter()
        # The data plane answers 502 from here on; open streams end now.
        route = self.routes.remove(sid)
        try:
            async with stage("pause", "runtime_pause", sid):
                await self.runtime.pause(sid, memory=memory,
                                         require_healthy_guest=require_healthy_guest)
        except BaseException:
            OPS_TOTAL.labels("pause", "error").inc()
            await self._after_failed_pause(rec, route)
            raise
        fault("pause.before_record")
        self.store.transition(sid, [S.PAUSING], S.PAUSED, self.now_us(), slot_addr=None,
                              vmm_pid=None)  # fmt: skip
        if self.shared is not None:
            self.shared.paused(rec, reason)
        OPS_TOTAL.labels("pause", reason).inc()
        log_event(log, "sandbox.paused", sandbox_id=sid, reason=reason, mode=mode,
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip

    async def _after_failed_pause(self, rec: SandboxRecord, route: Route | None) -> None:
        sid = rec.sandbox_id
        now = self.now_us()
        if self._is_paused(sid):
            self.store.transition(sid, [S.PAUSING], S.PAUSED, now, slot_addr=None, vmm_pid=None)
        elif route is not None and self.runtime.is_running(sid):
            self.store.transition(sid, [S.PAUSING], S.RUNNING, now)
            self.routes.add(route.handle, rec.access_token, rec.ingress)
        else:
            self.store.transition(sid, [S.PAUSING], S.KILLING, now)
            await self._runtime_kill(route.handle if route else self._handle(rec))
            self.store.delete(sid, [S.KILLING])
            log_event(log, "sandbox.lost", logging.ERROR, sandbox_id=sid, during="pause")

    async def resume(
        self, sandbox_id: str, timeout_s: int, auto_pause: bool | None = None
    ) -> SandboxRecord:
        """E2B v1 resume: Paused -> Resuming -> Running; StateConflict (409) if running."""
        self._check_timeout(timeout_s)
        async with self._locks.hold(sandbox_id):
            rec = self.get(sandbox_id)
            if rec.state is not S.PAUSED:
                raise StateConflict(f"sandbox {sandbox_id} is already running",
                                    actual=str(rec.state))  # fmt: skip
            await self._resume_locked(rec, timeout_s, auto_pause)
        return self.get(sandbox_id)

    async def _resume_locked(
        self, rec: SandboxRecord, timeout_s: int, auto_pause: bool | None = None,
        memory: bool = True,
    ) -> None:
        """Restore the memory state, or reboot the disk (`memory=False`, or after a
        filesystem-only pause): a reboot is a cold boot, admitted as one."""
        sid = rec.sandbox_id
        reboot = not memory or rec.pause_mode == "filesystem"
        await memory_pressure.relieve(self, rec.memory_mib, keep=sid)
        if reboot:
            await self.boots.wait()
        self._admit(rec.memory_mib, "resume a sandbox", boot=reboot, new=False,
                    team_id=rec.team_id)
        if self.shared is not None:
            await self.shared.resuming(sid)
        if not self.store.transition(sid, [S.PAUSED], S.RESUMING, self.now_us()):
            raise StateConflict(f"sandbox {sid} changed state", actual=str(rec.state))
        t0 = time.perf_counter()
        init = agent_init(rec, self.config.volumes_dir)
        try:
            with self.boots.held() if reboot else contextlib.nullcontext():
                async with stage("resume", "runtime_reboot" if reboot else "runtime_resume",
                                 sid):  # fmt: skip
                    handle = await self.runtime.resume(sid, init, memory=memory)
        except BaseException:
            OPS_TOTAL.labels("resume", "error").inc()
            if self._is_paused(sid):
                # A reboot discards the memory state before it boots: filesystem-only now.
                self.store.transition(sid, [S.RESUMING], S.PAUSED, self.now_us(),
                                      **({"pause_mode": "filesystem"} if reboot else {}))
            else:  # its paused state is gone: nothing left to resume
                self.store.transition(sid, [S.RESUMING], S.KILLING, self.now_us())
                await self._runtime_kill(self._handle(rec))
                self.store.delete(sid, [S.KILLING])
                log_event(log, "sandbox.lost", logging.ERROR, sandbox_id=sid, during="resume")
            raise
        # endAt counts from now: after the boot, however long it took.
        now = self.now_us()
        extra = {} if auto_pause is None else {"auto_pause": auto_pause}
        ok = self.store.transition(
            sid, [S.RESUMING], S.RUNNING, now, end_at_us=now + timeout_s * 1_000_000,
            slot_addr=handle.slot_addr, vmm_pid=handle.vmm_pid, pause_mode=None, **extra,
        )  # fmt: skip
        if not ok:
            await self._runtime_kill(handle)
            raise ShuttingDown("the node is shutting down")
        self.routes.add(handle, rec.access_token, rec.ingress, resumed=True)
        OPS_TOTAL.labels("resume", "ok").inc()
        log_event(log, "sandbox.resumed", sandbox_id=sid, slot=handle.slot_addr, reboot=reboot,
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip

    async def fence(self) -> None:
        """Cut off from the cluster (its lease may end): start nothing, end the sandbox
        traffic and pause every running sandbox, so none runs here once another node may
        take it over. Reversed by unfence()."""
        if self._fenced or not self._accepting:
            return
        self._fenced = True
        log_event(log, "node.fenced", level=logging.WARNING)
        for route in self.routes:
            for st in list(route.streams):
                st.abort("node fenced")
        await self._pause_all("fence")

    def unfence(self) -> None:
        if self._fenced:
            self._fenced = False
            log_event(log, "node.unfenced")

    def set_draining(self, draining: bool) -> None:
        if draining != self._draining:
            self._draining = draining
            log_event(log, "node.draining" if draining else "node.undrained")

    async def pause_all(self, reason: str) -> None:
        await self._pause_all(reason)

    async def demote_hot(self, reason: str) -> int:
        """Every hot-paused sandbox goes cold (its VMM ends, its state stays on disk): a
        drained node holds no memory for paused sandboxes. How many went."""
        hot = getattr(self.runtime, "hot", None)
        if hot is None:
            return 0
        return sum(await asyncio.gather(*(hot.demote(n, reason) for n in list(hot.names()))))

    async def route_for_paused(self, sandbox_id: str) -> Route | None:
        """autoResume: the data plane found no route; resume the sandbox if it is paused and
        asked for it, and give its new route (None: answer 502 as for any paused sandbox).
        TeamLimitReached if its team may not run one more (in a cluster: anywhere)."""
        rec = self.store.get(sandbox_id)
        if rec is None or not rec.auto_resume or rec.state not in (
                S.PAUSED, S.PAUSING, S.RESUMING) or not self._accepting or self._fenced:
            return None
        if rec.pause_mode == "filesystem":
            return None  # a reboot is no transparent wake-up: resumed only by connect
        try:
            async with self.team_hold(rec.team_id, 1, rec.memory_mib, "resume a sandbox"):
                await self.connect(sandbox_id, rec.timeout_s)
        except TeamLimitReached:
            raise  # the data plane says so (429), not "not found"
        except Exception as e:
            log_event(log, "sandbox.auto_resume_failed", logging.WARNING, sandbox_id=sandbox_id,
                      error=repr(e))  # fmt: skip
            return None
        OPS_TOTAL.labels("auto_resume", "ok").inc()
        return self.routes.get(sandbox_id)

    # -- snapshots -------------------------------------------------------------------------

    def _running_for(self, sandbox_id: str, what: str) -> SandboxRecord:
        rec = self.get(sandbox_id)
        if rec.state is not S.RUNNING:
            raise StateConflict(f"sandbox {sandbox_id} is {PUBLIC_STATE[rec.state]}: "
                                f"{what} needs a running sandbox", actual=str(rec.state))
        return rec
