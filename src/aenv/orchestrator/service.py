"""The orchestrator: one action per sandbox operation, over the store, the runtime and routes.

Actions: create, get, list, kill, set_timeout, connect, refresh, metrics, pause, resume,
snapshot, list_snapshots, delete_snapshot, fork. Each state change
is "CAS to a transitional state -> work -> CAS to the final state" under the sandbox's lock
(see `locks.py`); the API layer parses a request, calls one action and maps the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import string
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pydantic

from aenv import faults
from aenv.config import Config, MachineShape
from aenv.faults import fault
from aenv.machines.agent_replies import AgentMetrics
from aenv.machines.api import (
    AgentInit,
    Runtime,
    SandboxHandle,
    SnapshotInfo,
    TemplateInfo,
    TemplateNotFound,
    VmmExit,
)
from aenv.network.egress import EgressPolicy, EgressPolicyError
from aenv.obs import BOOTS_IN_FLIGHT, OPS_TOTAL, REJECTED_TOTAL, log_event, stage
from aenv.orchestrator import background, recovery, space
from aenv.orchestrator import snapshots as snaps
from aenv.orchestrator.errors import (
    CapacityExhausted,
    InvalidRequest,
    NotFound,
    ShuttingDown,
    SpaceExhausted,
    StateConflict,
    Unsupported,
)
from aenv.orchestrator.locks import Joiner, SandboxLocks
from aenv.orchestrator.routes import Route, RouteTable
from aenv.orchestrator.states import HAS_VM, HOLDS_CAPACITY, PUBLIC_STATE, SandboxState
from aenv.orchestrator.store import ListQuery, MetricSample, SandboxRecord, Store

log = logging.getLogger("aenv.orchestrator")
S = SandboxState

ID_ALPHABET = string.ascii_lowercase + string.digits
ID_LENGTH = 20
# How long a create that hit max_sandboxes is told to wait: VMs go away at TTL or kill.
FULL_RETRY_AFTER_S = 5
# How long a create that hit max_concurrent_boots is told to wait: about one boot.
BOOTS_RETRY_AFTER_S = 1
# E2B's cap on one /refreshes call.
MAX_REFRESH_S = 3600
# The SDK's range for one fork call.
MAX_FORK_COUNT = 20
# An auto-pause at endAt that failed is tried again this much later (the sandbox keeps running).
AUTO_PAUSE_RETRY_S = 30
# envdVersion of a sandbox restored from a snapshot whose template is gone.
FALLBACK_ENVD_VERSION = "0.6.4"


def new_sandbox_id() -> str:
    return "".join(secrets.choice(ID_ALPHABET) for _ in range(ID_LENGTH))


def new_access_token() -> str:
    return secrets.token_hex(24)


def _agent_init(rec: SandboxRecord) -> AgentInit:
    """What every start of `rec` (create, resume, fork child) sets up around its guest."""
    return AgentInit(access_token=rec.access_token, env_vars=dict(rec.env_vars),
                     default_user=rec.default_user or "user",
                     default_workdir=rec.default_workdir, egress=rec.egress)


@dataclass
class CreateRequest:
    """What a create asks for, already validated for types by the API."""

    template: str
    timeout_s: int
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    secure: bool = True
    auto_pause: bool = False
    auto_resume: bool = False
    auto_pause_memory: bool = True  # False: the TTL auto-pause is filesystem-only
    allow_internet: bool | None = None
    allow_out: list[object] = field(default_factory=list)  # E2B network.allowOut
    deny_out: list[object] = field(default_factory=list)  # E2B network.denyOut
    vcpus: int | None = None
    memory_mib: int | None = None


class Orchestrator:
    """Owns every sandbox of this node. Valid between `start()` and `close()`."""

    def __init__(
        self,
        config: Config,
        runtime: Runtime,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.store = Store(config.db_path)
        self.routes = RouteTable()
        self.client_id = socket.gethostname() or "aenv"
        self._clock = clock
        self._locks = SandboxLocks(config.transition_wait_s)
        self._joiner = Joiner()
        self._booting = 0
        self._accepting = False
        self._tasks: list[asyncio.Task[None]] = []
        self._expiring: set[str] = set()
        # Removals of sandboxes whose VMM exited on its own (background.reap_dead_vmm).
        self._reaping: set[asyncio.Task[None]] = set()
        self._started = False
        self._closing = False
        self._snap_refs = snaps.SnapshotRefs()
        # Free bytes on the data filesystem (space admission); tests replace it.
        self.free_bytes: Callable[[], int] = lambda: space.free_bytes(config.data_dir)

    # -- time ------------------------------------------------------------------------------

    def now_us(self) -> int:
        return int(self._clock() * 1_000_000)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        faults.arm(self.config.faults)  # crash tests only; empty: every point is a no-op
        self.store.open()
        self.runtime.on_vmm_exit = self._vmm_exited  # adopted VMs are watched too
        async with stage("node", "runtime_start"):
            await self.runtime.start()
        await recovery.recover(self)
        self._tasks = [
            asyncio.create_task(background.ttl_sweeper(self), name="aenv-ttl"),
            asyncio.create_task(background.metrics_sampler(self), name="aenv-metrics"),
            asyncio.create_task(background.snapshot_checksums(self), name="aenv-checksums"),
            asyncio.create_task(background.scrubber(self), name="aenv-scrub"),
        ]
        self._accepting = True
        self._started = True
        log_event(log, "node.started", sandboxes=len(self.routes))

    def begin_shutdown(self) -> None:
        """Stop accepting creates and end open data-plane streams (SIGTERM, first step)."""
        if not self._accepting:
            return
        self._accepting = False
        for route in self.routes:
            for s in list(route.streams):
                s.abort()
        log_event(log, "node.draining")

    async def close(self) -> None:
        """End every VM (runtime.close) and forget their records; safe to call twice."""
        self.begin_shutdown()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        self._closing = True  # removals still waiting give up; one under way finishes
        await asyncio.gather(*self._reaping, return_exceptions=True)
        if not self.store.is_open:
            return
        if self.config.on_shutdown == "pause":
            await self._pause_all("shutdown")
        for route in self.routes:
            self.routes.remove(route.sandbox_id)
        doomed = self.store.with_state(HAS_VM)
        async with stage("node", "runtime_close"):
            try:
                await self.runtime.close()
            except Exception:
                log.exception("node.runtime_close_failed")
        for rec in doomed:
            self.store.force_delete(rec.sandbox_id)
        self.store.close()
        log_event(log, "node.stopped", killed=len(doomed))

    async def _pause_all(self, reason: str) -> None:
        """Pause every running sandbox (waiting for operations in flight on each)."""
        ids = [r.sandbox_id for r in self.store.with_state(HOLDS_CAPACITY - {S.CREATING})]

        async def one(sid: str) -> bool:
            try:
                async with self._locks.hold(sid):
                    rec = self.store.get(sid)
                    if rec is None or rec.state is not S.RUNNING:
                        return False
                    await self._pause_locked(rec, reason)
                    return True
            except Exception as e:
                log_event(log, "sandbox.pause_failed", logging.WARNING, sandbox_id=sid,
                          reason=reason, error=repr(e))  # fmt: skip
                return False

        t0 = time.perf_counter()
        done = await asyncio.gather(*(one(sid) for sid in ids))
        log_event(log, "node.paused_all", paused=sum(done), failed=len(ids) - sum(done),
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip

    # -- reads -----------------------------------------------------------------------------

    def templates(self, *, usage: bool = False) -> list[TemplateInfo]:
        return self.runtime.templates(usage=usage)

    def template(self, name: str) -> TemplateInfo:
        return self.runtime.template(name)

    def get(self, sandbox_id: str) -> SandboxRecord:
        rec = self.store.get(sandbox_id)
        if rec is None or rec.state not in PUBLIC_STATE:
            raise NotFound(f"sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it")
        return rec

    def list(self, q: ListQuery) -> tuple[list[SandboxRecord], tuple[int, str] | None]:
        return self.store.list(q)

    def stats(self) -> dict[SandboxState, int]:
        return self.store.count_by_state()

    # -- create ----------------------------------------------------------------------------

    def _check_timeout(self, timeout_s: int) -> None:
        if timeout_s < 0:
            raise InvalidRequest("timeout must not be negative")
        if timeout_s > self.config.max_timeout_s:
            raise InvalidRequest(
                f"timeout cannot be greater than {self.config.max_timeout_s} seconds"
            )

    def _shape(self, base: MachineShape, req: CreateRequest) -> MachineShape:
        if req.vcpus is None and req.memory_mib is None:
            return base
        try:
            return MachineShape(
                vcpus=req.vcpus if req.vcpus is not None else base.vcpus,
                memory_mib=req.memory_mib if req.memory_mib is not None else base.memory_mib,
                disk_mib=base.disk_mib,
            )
        except pydantic.ValidationError as e:
            err = e.errors()[0]
            name = {"vcpus": "cpuCount", "memory_mib": "memoryMB"}.get(str(err["loc"][0]), "")
            raise InvalidRequest(f"invalid {name}: {err['msg']}") from None

    def _admit(self, new_mib: int, op: str, *, vms: int = 1, boot: bool = True) -> None:
        """Refuse an operation before it touches anything: shutting down (503), over
        max_sandboxes or max_concurrent_boots (429), short of space (507). Callers insert or
        CAS their record with no await after this, so the counts stay exact."""
        if not self._accepting:
            raise ShuttingDown("the node is shutting down")
        if vms and self.store.count(HOLDS_CAPACITY) + vms > self.config.max_sandboxes:
            REJECTED_TOTAL.labels("max_sandboxes").inc()
            raise CapacityExhausted(
                f"the node is at its limit of {self.config.max_sandboxes} running sandboxes",
                retry_after_s=FULL_RETRY_AFTER_S,
            )
        if boot and self._booting >= self.config.max_concurrent_boots:
            REJECTED_TOTAL.labels("max_concurrent_boots").inc()
            raise CapacityExhausted(
                f"the node is already booting {self.config.max_concurrent_boots} sandboxes",
                retry_after_s=BOOTS_RETRY_AFTER_S,
            )
        self._admit_space(new_mib, op)

    def _admit_space(self, new_mib: int, op: str, *, keep_running: bool = True) -> None:
        """507 unless free space >= RAM of the running sandboxes (`keep_running`) + `new_mib`
        + the reserve (space.py)."""
        running = self.store.sum_memory_mib(HOLDS_CAPACITY) if keep_running else 0
        reserve = self.config.disk_reserve_mib
        free = self.free_bytes()
        short = space.shortfall(free, running, new_mib, reserve)
        if short:
            REJECTED_TOTAL.labels("disk_space").inc()
            raise SpaceExhausted(
                f"not enough free space on the data filesystem to {op}: {free >> 20} MiB free, "
                f"{(free + short) >> 20} MiB needed ({space.explain(running, new_mib, reserve)})"
            )

    def resolve_template(self, name: str) -> TemplateInfo:
        """A template by id or alias, else a snapshot by id, else the newest snapshot carrying
        `name`; TemplateNotFound (404) if none."""
        try:
            return self.runtime.template(name)
        except TemplateNotFound:
            pass
        snap = self.find_snapshot(name)
        try:
            source = self.runtime.template(snap.template)
        except TemplateNotFound:
            source = None
        return TemplateInfo(
            template_id=snap.snapshot_id, aliases=list(snap.names), shape=snap.shape,
            envd_version=source.envd_version if source else FALLBACK_ENVD_VERSION,
            build_id=snap.snapshot_id, created_at=snap.created_at,
            env=dict(source.env) if source else {}, user=source.user if source else None,
            workdir=source.workdir if source else None,
        )  # fmt: skip

    async def create(self, req: CreateRequest) -> SandboxRecord:
        self._check_timeout(req.timeout_s)
        if req.auto_resume and not req.auto_pause:
            raise InvalidRequest("autoResume needs autoPause: only a paused sandbox resumes")
        if req.auto_resume and not req.auto_pause_memory:
            raise InvalidRequest("autoResume cannot be combined with autoPauseMemory false: a "
                                 "filesystem-only pause reboots on resume, so it is resumed "
                                 "only by connect")  # fmt: skip
        try:
            egress = EgressPolicy.from_request(req.allow_internet, req.allow_out, req.deny_out)
        except EgressPolicyError as e:
            raise InvalidRequest(str(e)) from None
        info = self.resolve_template(req.template)  # TemplateNotFound -> 404
        shape = self._shape(info.shape, req)
        # From the admission check to the insert there is no await: the count stays exact.
        self._admit(shape.memory_mib, "create a sandbox")
        rec = self._new_record(req, info, shape, egress)
        sid = rec.sandbox_id
        self.store.insert(rec)
        self._booting += 1
        BOOTS_IN_FLIGHT.inc()
        t0 = time.perf_counter()
        try:
            async with self._locks.hold(sid):
                handle = await self._boot(rec, info, shape)
        except BaseException:
            OPS_TOTAL.labels("create", "error").inc()
            raise
        finally:
            self._booting -= 1
            BOOTS_IN_FLIGHT.dec()
        OPS_TOTAL.labels("create", "ok").inc()
        log_event(log, "sandbox.created", sandbox_id=sid, template=info.template_id,
                  vcpus=shape.vcpus, memory_mib=shape.memory_mib, slot=handle.slot_addr,
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip
        return self.get(sid)

    def _new_record(self, req: CreateRequest, info: TemplateInfo, shape: MachineShape,
                    egress: EgressPolicy) -> SandboxRecord:
        now = self.now_us()
        return SandboxRecord(
            sandbox_id=new_sandbox_id(),
            template_id=info.template_id,
            alias=req.template if req.template in info.aliases else next(iter(info.aliases), None),
            state=S.CREATING,
            started_at_us=now,
            end_at_us=now + req.timeout_s * 1_000_000,
            timeout_s=req.timeout_s,
            vcpus=shape.vcpus,
            memory_mib=shape.memory_mib,
            disk_mib=shape.disk_mib,
            envd_version=info.envd_version,
            metadata=dict(req.metadata),
            env_vars={**info.env, **req.env_vars},
            access_token=new_access_token() if req.secure else None,
            auto_pause=req.auto_pause,
            auto_resume=req.auto_resume,
            auto_pause_memory=req.auto_pause_memory,
            allow_internet=req.allow_internet,
            egress=egress,
            updated_at_us=now,
            default_user=info.user,
            default_workdir=info.workdir,
        )

    async def _boot(
        self, rec: SandboxRecord, info: TemplateInfo, shape: MachineShape
    ) -> SandboxHandle:
        sid = rec.sandbox_id
        init = _agent_init(rec)
        # A snapshot (not a template): a DELETE meanwhile keeps its files until it is cloned.
        snap = info.template_id if info.template_id == info.build_id else None
        try:
            if snap is not None:
                self._snap_refs.acquire(snap)
            try:
                async with stage("create", "runtime_create", sid):
                    handle = await self.runtime.create(sid, info.template_id, init, shape)
            finally:
                if snap is not None and self._snap_refs.release(snap):
                    self._delete_snapshot_files(snap)
        except BaseException:
            self.store.delete(sid, [S.CREATING])
            raise
        now = self.now_us()
        ok = self.store.transition(
            sid, [S.CREATING], S.RUNNING, now,
            end_at_us=now + rec.timeout_s * 1_000_000,
            slot_addr=handle.slot_addr, vmm_pid=handle.vmm_pid,
        )  # fmt: skip
        if not ok:  # the node closed under us and dropped the record
            await self._runtime_kill(handle)
            raise ShuttingDown("the node is shutting down")
        fault("create.after_record")
        self.routes.add(handle, rec.access_token)
        return handle

    # -- kill ------------------------------------------------------------------------------

    async def kill(self, sandbox_id: str) -> None:
        """Kill a running or paused sandbox; NotFound if there is none by that id."""
        await self._joiner.run(sandbox_id, "kill", lambda: self._kill(sandbox_id))

    async def _kill(self, sandbox_id: str) -> None:
        async with self._locks.hold(sandbox_id):
            rec = self.get(sandbox_id)
            await self._kill_locked(rec, "request")

    async def _kill_locked(self, rec: SandboxRecord, reason: str, **detail: object) -> None:
        sid = rec.sandbox_id
        if not self.store.transition(sid, [rec.state], S.KILLING, self.now_us()):
            raise StateConflict(f"sandbox {sid} changed state", actual=str(rec.state))
        t0 = time.perf_counter()
        route = self.routes.remove(sid)
        # A paused sandbox has no VM but its files: the runtime deletes them too.
        handle = route.handle if route else self._handle(rec)
        async with stage("kill", "runtime_kill", sid):
            await self._runtime_kill(handle)
        fault("kill.before_record")
        self.store.delete(sid, [S.KILLING])
        OPS_TOTAL.labels("kill", reason).inc()
        log_event(log, "sandbox.killed", sandbox_id=sid, reason=reason, **detail,
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip

    def _vmm_exited(self, sandbox_id: str, how: VmmExit) -> None:
        """The runtime's report that a sandbox's VMM exited on its own (crash, OOM kill, a
        kill by hand, guest poweroff or reboot): remove the sandbox as a kill does."""
        task = asyncio.get_running_loop().create_task(
            background.reap_dead_vmm(self, sandbox_id, how), name=f"aenv-reap-{sandbox_id}")
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)

    async def remove_dead(self, sandbox_id: str, how: VmmExit) -> bool:
        """Kill (reason `vmm_exited`) a Running sandbox whose VMM has exited. True when
        nothing is left to do: removed here, or an operation on it won (a kill, a pause
        that ended it, a resume that runs a new VM); False while its state is not settled
        (a fork child still Creating, a record recovery has not resolved yet).
        Called through the kill Joiner by `background.reap_dead_vmm` only when the lock is
        free, so it decides without yielding and a kill request can only join a removal."""
        async with self._locks.hold(sandbox_id):
            rec = self.store.get(sandbox_id)
            if (rec is None or rec.state in (S.PAUSED, S.KILLING)
                    or self.runtime.is_running(sandbox_id)):
                return True
            if rec.state is not S.RUNNING:
                return False
            await self._kill_locked(rec, "vmm_exited", exit_code=how.exit_code,
                                    signal=how.signal, oom_killed=how.oom_killed or None)
            return True

    async def _runtime_kill(self, handle: SandboxHandle) -> None:
        try:
            await self.runtime.kill(handle)
        except Exception:
            # The record goes anyway: runtime.close() at shutdown ends whatever is left.
            log.exception("sandbox.kill_failed", extra={"kv": {"sandbox_id": handle.sandbox_id}})

    def _handle(self, rec: SandboxRecord) -> SandboxHandle:
        return SandboxHandle(
            sandbox_id=rec.sandbox_id,
            template_id=rec.template_id,
            shape=MachineShape(vcpus=rec.vcpus, memory_mib=rec.memory_mib, disk_mib=rec.disk_mib),
            slot_addr=rec.slot_addr or "",
            vmm_pid=rec.vmm_pid or 0,
        )

    async def expire(self, sandbox_id: str) -> None:
        """TTL: if endAt has really passed, pause (autoPause) or kill."""
        async with self._locks.hold(sandbox_id):
            rec = self.store.get(sandbox_id)
            if rec is None or rec.state is not S.RUNNING or rec.end_at_us > self.now_us():
                return  # killed, paused or extended meanwhile
            if not rec.auto_pause:
                await self._kill_locked(rec, "timeout")
                return
            try:
                await self._pause_locked(rec, "timeout", memory=rec.auto_pause_memory)
            except Exception as e:
                now = self.now_us()
                retry = self.store.update(sandbox_id, [S.RUNNING], now,
                                          end_at_us=now + AUTO_PAUSE_RETRY_S * 1_000_000)
                log_event(log, "sandbox.auto_pause_failed", logging.ERROR, sandbox_id=sandbox_id,
                          error=repr(e), retry_in_s=AUTO_PAUSE_RETRY_S if retry else None)

    # -- pause / resume --------------------------------------------------------------------

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
            self.routes.add(route.handle, rec.access_token)
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
        self._admit(rec.memory_mib, "resume a sandbox", boot=reboot)
        if not self.store.transition(sid, [S.PAUSED], S.RESUMING, self.now_us()):
            raise StateConflict(f"sandbox {sid} changed state", actual=str(rec.state))
        t0 = time.perf_counter()
        init = _agent_init(rec)
        try:
            with self._boot_in_flight() if reboot else contextlib.nullcontext():
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
        self.routes.add(handle, rec.access_token)
        OPS_TOTAL.labels("resume", "ok").inc()
        log_event(log, "sandbox.resumed", sandbox_id=sid, slot=handle.slot_addr, reboot=reboot,
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip

    @contextlib.contextmanager
    def _boot_in_flight(self) -> Iterator[None]:
        """Counts against max_concurrent_boots (and the in-flight gauge) while it lasts."""
        self._booting += 1
        BOOTS_IN_FLIGHT.inc()
        try:
            yield
        finally:
            self._booting -= 1
            BOOTS_IN_FLIGHT.dec()

    async def route_for_paused(self, sandbox_id: str) -> Route | None:
        """autoResume: the data plane found no route; resume the sandbox if it is paused and
        asked for it, and give its new route (None: answer 502 as for any paused sandbox)."""
        rec = self.store.get(sandbox_id)
        if rec is None or not rec.auto_resume or rec.state not in (
                S.PAUSED, S.PAUSING, S.RESUMING) or not self._accepting:
            return None
        if rec.pause_mode == "filesystem":
            return None  # a reboot is no transparent wake-up: resumed only by connect
        try:
            await self.connect(sandbox_id, rec.timeout_s)
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

    async def snapshot(self, sandbox_id: str, name: str | None = None, *,
                       memory: bool = True) -> SnapshotInfo:
        """Running -> Snapshotting -> Running: clone the sandbox into a new snapshot, usable
        as a templateID. The sandbox keeps running (it stops only while its state is saved).
        `memory=False`: filesystem-only, the disk alone; a create from it cold-boots."""
        names = snaps.check_name(name)
        async with self._locks.hold(sandbox_id):
            rec = self._running_for(sandbox_id, "a snapshot")
            self._admit(0, "take a snapshot", vms=0, boot=False)
            if not self.store.transition(sandbox_id, [S.RUNNING], S.SNAPSHOTTING, self.now_us()):
                raise StateConflict(f"sandbox {sandbox_id} changed state", actual=str(rec.state))
            snap_id = snaps.new_snapshot_id()
            t0 = time.perf_counter()
            try:
                async with stage("snapshot", "runtime_snapshot", sandbox_id):
                    info = await self.runtime.snapshot_sandbox(sandbox_id, snap_id, names,
                                                               memory=memory)
            except BaseException:
                OPS_TOTAL.labels("snapshot", "error").inc()
                raise
            finally:
                # The runtime lets the VM continue whatever happened.
                self.store.transition(sandbox_id, [S.SNAPSHOTTING], S.RUNNING, self.now_us())
        OPS_TOTAL.labels("snapshot", "ok").inc()
        log_event(log, "snapshot.created", sandbox_id=sandbox_id, snapshot_id=snap_id,
                  mode="full" if memory else "filesystem",
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip
        return info

    def _snapshots(self) -> list[SnapshotInfo]:
        return [s for s in self.runtime.list_snapshots()
                if not self._snap_refs.hidden(s.snapshot_id)]  # fmt: skip

    def find_snapshot(self, name: str) -> SnapshotInfo:
        """By id, else the newest carrying `name`; TemplateNotFound (404)."""
        if not self._snap_refs.hidden(name):
            try:
                return self.runtime.snapshot_info(name)
            except TemplateNotFound:
                pass
        return snaps.newest_named(self._snapshots(), name)

    def list_snapshots(
        self, sandbox_id: str | None = None, name: str | None = None,
        limit: int = snaps.MAX_PAGE, cursor: tuple[int, str] | None = None,
    ) -> tuple[list[SnapshotInfo], tuple[int, str] | None]:
        return snaps.page(self._snapshots(), sandbox_id=sandbox_id, name=name, limit=limit,
                          cursor=cursor)  # fmt: skip

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Gone from listings and lookups at once; its files go now, or when the last
        restore in flight from it has cloned them. NotFound (404). A template is deleted
        the same way (sandboxes and snapshots made from it keep their own files), except the
        node's default template (400)."""
        if self._snap_refs.hidden(snapshot_id):
            raise NotFound(f"snapshot '{snapshot_id}' not found")
        try:
            self.runtime.snapshot_info(snapshot_id)
        except TemplateNotFound:
            try:
                info = self.runtime.template(snapshot_id)
            except TemplateNotFound:
                raise NotFound(f"snapshot '{snapshot_id}' not found") from None
            if info.template_id == self.config.default_template:
                raise Unsupported(f"'{snapshot_id}' is the node's default template: it is "
                                  "rebuilt or removed with the aenv CLI") from None
            if not hasattr(self.runtime, "remove_template"):
                raise Unsupported(f"'{snapshot_id}' is a template this runtime cannot "
                                  "remove") from None
            self.runtime.remove_template(info.template_id)
            snapshot_id = info.build_id  # the template's snapshot, deleted like any other
        if self._snap_refs.doom(snapshot_id):
            self._delete_snapshot_files(snapshot_id)
        OPS_TOTAL.labels("snapshot_delete", "ok").inc()
        log_event(log, "snapshot.deleted", snapshot_id=snapshot_id,
                  deferred=self._snap_refs.hidden(snapshot_id))  # fmt: skip

    def _delete_snapshot_files(self, snapshot_id: str) -> None:
        try:
            self.runtime.delete_snapshot(snapshot_id)
        except TemplateNotFound:
            pass
        except Exception:
            log.exception("snapshot.delete_failed", extra={"kv": {"snapshot_id": snapshot_id}})

    # -- fork ------------------------------------------------------------------------------

    async def fork(
        self, sandbox_id: str, count: int, timeout_s: int | None = None
    ) -> list[SandboxRecord | BaseException]:
        """Snapshot the sandbox and start `count` children from it, each with its own id and
        token and the source's env, metadata and lifecycle. A running source keeps running
        (Forking meanwhile); a paused one, hot or cold, is forked from its paused state and
        stays Paused (its lock, held throughout, keeps a resume or kill out). One entry per
        child: its record, or the error that child failed with (children over max_sandboxes
        get CapacityExhausted)."""
        if isinstance(count, bool) or not 1 <= count <= MAX_FORK_COUNT:
            raise InvalidRequest(f"count must be between 1 and {MAX_FORK_COUNT}")
        if timeout_s is not None:
            self._check_timeout(timeout_s)
        async with self._locks.hold(sandbox_id):
            src = self.get(sandbox_id)
            paused = src.state is S.PAUSED
            if not paused:
                src = self._running_for(sandbox_id, "a fork")
            if not self._accepting:
                raise ShuttingDown("the node is shutting down")
            room = max(0, self.config.max_sandboxes - self.store.count(HOLDS_CAPACITY))
            n = min(count, room)
            self._admit_space(n * src.memory_mib, f"fork {n} sandboxes")
            ttl = src.timeout_s if timeout_s is None else timeout_s
            kids = [self._child_record(src, ttl) for _ in range(n)]
            for k in kids:
                self.store.insert(k)
            if n and not paused and not self.store.transition(
                    sandbox_id, [S.RUNNING], S.FORKING, self.now_us()):
                for k in kids:
                    self.store.delete(k.sandbox_id, [S.CREATING])
                raise StateConflict(f"sandbox {sandbox_id} changed state", actual=str(src.state))
            t0 = time.perf_counter()
            try:
                results: list[SandboxHandle | BaseException] = []
                if n:
                    inits = [(k.sandbox_id, _agent_init(k)) for k in kids]
                    async with stage("fork", "runtime_fork", sandbox_id):
                        results = await self.runtime.fork(sandbox_id, inits)
            except BaseException:
                OPS_TOTAL.labels("fork", "error").inc()
                for k in kids:
                    self.store.delete(k.sandbox_id, [S.CREATING])
                raise
            finally:
                if n and not paused:
                    self.store.transition(sandbox_id, [S.FORKING], S.RUNNING, self.now_us())
            out: list[SandboxRecord | BaseException] = []
            for k, r in zip(kids, results, strict=True):
                out.append(self._fork_child_started(k, r))
        out += [CapacityExhausted(
            f"the node is at its limit of {self.config.max_sandboxes} running sandboxes",
            retry_after_s=FULL_RETRY_AFTER_S) for _ in range(count - n)]  # fmt: skip
        ok = sum(isinstance(r, SandboxRecord) for r in out)
        OPS_TOTAL.labels("fork", "ok").inc(ok)
        log_event(log, "sandbox.forked", sandbox_id=sandbox_id, requested=count, started=ok,
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip
        return out

    async def fork_snapshot(self, snapshot: str, count: int, timeout_s: int
                            ) -> list[SandboxRecord | BaseException]:
        """`count` sandboxes from a named snapshot (id or name) at once, as a fork's
        children: restored in parallel (at most max_concurrent_boots at a time), each with
        its own id, token and entropy. One entry per child, as `fork`."""
        if isinstance(count, bool) or not 1 <= count <= MAX_FORK_COUNT:
            raise InvalidRequest(f"count must be between 1 and {MAX_FORK_COUNT}")
        self._check_timeout(timeout_s)
        snap = self.find_snapshot(snapshot)  # TemplateNotFound -> 404
        info = self.resolve_template(snap.snapshot_id)
        if not self._accepting:
            raise ShuttingDown("the node is shutting down")
        n = min(count, max(0, self.config.max_sandboxes - self.store.count(HOLDS_CAPACITY)))
        self._admit_space(n * info.shape.memory_mib, f"create {n} sandboxes")
        req = CreateRequest(template=snap.snapshot_id, timeout_s=timeout_s)
        egress = EgressPolicy.from_request(None, [], [])
        kids = [self._new_record(req, info, info.shape, egress) for _ in range(n)]
        for k in kids:
            self.store.insert(k)
        t0 = time.perf_counter()
        self._snap_refs.acquire(snap.snapshot_id)  # a DELETE meanwhile waits for the clones
        try:
            async with stage("fork", "runtime_children", snap.snapshot_id):
                results = await self.runtime.create_children(
                    snap.snapshot_id, [(k.sandbox_id, _agent_init(k)) for k in kids])
        except BaseException:
            for k in kids:
                self.store.delete(k.sandbox_id, [S.CREATING])
            raise
        finally:
            if self._snap_refs.release(snap.snapshot_id):
                self._delete_snapshot_files(snap.snapshot_id)
        out: list[SandboxRecord | BaseException] = [
            self._fork_child_started(k, r) for k, r in zip(kids, results, strict=True)]
        out += [CapacityExhausted(
            f"the node is at its limit of {self.config.max_sandboxes} running sandboxes",
            retry_after_s=FULL_RETRY_AFTER_S) for _ in range(count - n)]  # fmt: skip
        log_event(log, "snapshot.forked", snapshot_id=snap.snapshot_id, requested=count,
                  started=sum(isinstance(r, SandboxRecord) for r in out),
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip
        return out

    def _child_record(self, src: SandboxRecord, ttl_s: int) -> SandboxRecord:
        now = self.now_us()
        return SandboxRecord(
            sandbox_id=new_sandbox_id(), template_id=src.template_id, alias=src.alias,
            state=S.CREATING, started_at_us=now, end_at_us=now + ttl_s * 1_000_000,
            timeout_s=ttl_s, vcpus=src.vcpus, memory_mib=src.memory_mib,
            disk_mib=src.disk_mib, envd_version=src.envd_version,
            metadata=dict(src.metadata), env_vars=dict(src.env_vars),
            access_token=new_access_token() if src.access_token is not None else None,
            auto_pause=src.auto_pause, auto_resume=src.auto_resume,
            auto_pause_memory=src.auto_pause_memory,
            allow_internet=src.allow_internet, egress=src.egress, updated_at_us=now,
            default_user=src.default_user, default_workdir=src.default_workdir,
        )  # fmt: skip

    def _fork_child_started(
        self, kid: SandboxRecord, r: SandboxHandle | BaseException
    ) -> SandboxRecord | BaseException:
        sid = kid.sandbox_id
        if isinstance(r, BaseException):
            self.store.delete(sid, [S.CREATING])
            log_event(log, "sandbox.fork_child_failed", logging.WARNING, sandbox_id=sid,
                      error=repr(r))  # fmt: skip
            return r
        now = self.now_us()
        ok = self.store.transition(
            sid, [S.CREATING], S.RUNNING, now, started_at_us=now,
            end_at_us=now + kid.timeout_s * 1_000_000, slot_addr=r.slot_addr, vmm_pid=r.vmm_pid,
        )  # fmt: skip
        if not ok:
            return ShuttingDown("the node is shutting down")
        self.routes.add(r, kid.access_token)
        return self.get(sid)

    # -- TTL -------------------------------------------------------------------------------

    def _running(self, sandbox_id: str) -> SandboxRecord:
        rec = self.get(sandbox_id)
        if rec.state is S.PAUSED:
            raise StateConflict(f"sandbox {sandbox_id} is paused", actual=str(rec.state))
        return rec

    async def set_timeout(self, sandbox_id: str, timeout_s: int) -> None:
        """endAt = now + timeout (may shorten it)."""
        self._check_timeout(timeout_s)
        async with self._locks.hold(sandbox_id):
            rec = self._running(sandbox_id)
            now = self.now_us()
            end = now + timeout_s * 1_000_000
            if not self.store.update(sandbox_id, [rec.state], now, end_at_us=end):
                raise NotFound(f"sandbox \"{sandbox_id}\" doesn't exist")
        log_event(log, "sandbox.timeout_set", logging.DEBUG,
                  sandbox_id=sandbox_id, timeout_s=timeout_s)  # fmt: skip

    async def refresh(self, sandbox_id: str, duration_s: int | None) -> None:
        """Keep alive for `duration_s` more (extend-only); default: the sandbox's own timeout."""
        if duration_s is not None and not 0 <= duration_s <= MAX_REFRESH_S:
            raise InvalidRequest(f"duration must be between 0 and {MAX_REFRESH_S} seconds")
        async with self._locks.hold(sandbox_id):
            rec = self._running(sandbox_id)
            d = rec.timeout_s if duration_s is None else duration_s
            now = self.now_us()
            self.store.extend_end(sandbox_id, [rec.state], now + d * 1_000_000, now)

    async def connect(
        self, sandbox_id: str, timeout_s: int, memory: bool = True
    ) -> tuple[SandboxRecord, bool]:
        """Running: extend-only TTL, (record, False). Paused: resume with endAt = now +
        timeout, (record, True); `memory=False` resumes by reboot (the memory state, if
        any, is discarded)."""
        self._check_timeout(timeout_s)
        async with self._locks.hold(sandbox_id):
            rec = self.get(sandbox_id)
            if rec.state is S.PAUSED:
                await self._resume_locked(rec, timeout_s, memory=memory)
                return self.get(sandbox_id), True
            now = self.now_us()
            self.store.extend_end(sandbox_id, [rec.state], now + timeout_s * 1_000_000, now)
        return self.get(sandbox_id), False

    # -- metrics ---------------------------------------------------------------------------

    async def sample(self, sandbox_id: str) -> bool:
        """Take one metrics sample from the agent; False if it did not answer."""
        route = self.routes.get(sandbox_id)
        if route is None:
            return False
        try:
            async with asyncio.timeout(background.SAMPLE_TIMEOUT_S):
                raw = await self.runtime.agent_metrics(route.handle)
            m = _metric_from_agent(raw, self.now_us())
        except Exception as e:
            log_event(log, "sandbox.metrics_failed", logging.DEBUG, sandbox_id=sandbox_id,
                      error=repr(e))  # fmt: skip
            return False
        return self.store.add_metric(sandbox_id, m)

    async def metrics(
        self, sandbox_id: str, start_us: int | None, end_us: int | None
    ) -> list[MetricSample]:
        """Samples in [start, end] (defaults: the sandbox's start, now). A window reaching the
        present gets a fresh sample if the last one is older than the sampling interval."""
        rec = self.get(sandbox_id)
        now = self.now_us()
        interval_us = int(self.config.metrics_interval_s * 1_000_000)
        if rec.state is not S.PAUSED and (end_us is None or end_us >= now - interval_us):
            last = self.store.last_metric_us(sandbox_id)
            if last is None or last < now - interval_us:
                await self.sample(sandbox_id)
        start = rec.started_at_us if start_us is None else start_us
        end = self.now_us() if end_us is None else end_us
        return self.store.metrics(sandbox_id, start, end)


def _metric_from_agent(raw: dict[str, object], now_us: int) -> MetricSample:
    """A sample from the guest's (untrusted) numbers: GuestReplyError unless each is in range.
    The timestamp is the node's own."""
    m = AgentMetrics.parse(raw)
    return MetricSample(
        ts_us=now_us, cpu_count=m.cpu_count, cpu_used_pct=m.cpu_used_pct,
        mem_used=m.mem_used, mem_total=m.mem_total, mem_cache=m.mem_cache,
        disk_used=m.disk_used, disk_total=m.disk_total,
    )
