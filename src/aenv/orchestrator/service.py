"""The orchestrator: one action per sandbox operation, over the store, the runtime and routes.

Actions: create, get, list, kill, set_timeout, connect, refresh, metrics. Each state change
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
from collections.abc import Callable
from dataclasses import dataclass, field

import pydantic

from aenv.config import Config, MachineShape
from aenv.orchestrator import background, recovery
from aenv.orchestrator.errors import (
    CapacityExhausted,
    InvalidRequest,
    NotFound,
    ShuttingDown,
    StateConflict,
    Unsupported,
)
from aenv.orchestrator.locks import Joiner, SandboxLocks
from aenv.orchestrator.obs import BOOTS_IN_FLIGHT, OPS_TOTAL, REJECTED_TOTAL, log_event, stage
from aenv.orchestrator.routes import RouteTable
from aenv.orchestrator.runtime_api import (
    AgentInit,
    Runtime,
    SandboxHandle,
    TemplateInfo,
)
from aenv.orchestrator.states import HAS_VM, PUBLIC_STATE, SandboxState
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


def new_sandbox_id() -> str:
    return "".join(secrets.choice(ID_ALPHABET) for _ in range(ID_LENGTH))


def new_access_token() -> str:
    return secrets.token_hex(24)


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
    allow_internet: bool | None = None
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

    # -- time ------------------------------------------------------------------------------

    def now_us(self) -> int:
        return int(self._clock() * 1_000_000)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self.store.open()
        async with stage("node", "runtime_start"):
            await self.runtime.start()
        await recovery.recover(self)
        self._tasks = [
            asyncio.create_task(background.ttl_sweeper(self), name="aenv-ttl"),
            asyncio.create_task(background.metrics_sampler(self), name="aenv-metrics"),
        ]
        self._accepting = True
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
        if self.config.on_shutdown == "pause":
            log_event(log, "node.shutdown_pause_unsupported", logging.WARNING,
                      note="pause is not implemented yet; killing running sandboxes")  # fmt: skip
        if not self.store.is_open:
            return
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

    # -- reads -----------------------------------------------------------------------------

    def templates(self) -> list[TemplateInfo]:
        return self.runtime.templates()

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

    def _admit(self) -> None:
        if not self._accepting:
            raise ShuttingDown("the node is shutting down")
        if self.store.count(HAS_VM) >= self.config.max_sandboxes:
            REJECTED_TOTAL.labels("max_sandboxes").inc()
            raise CapacityExhausted(
                f"the node is at its limit of {self.config.max_sandboxes} running sandboxes",
                retry_after_s=FULL_RETRY_AFTER_S,
            )
        if self._booting >= self.config.max_concurrent_boots:
            REJECTED_TOTAL.labels("max_concurrent_boots").inc()
            raise CapacityExhausted(
                f"the node is already booting {self.config.max_concurrent_boots} sandboxes",
                retry_after_s=BOOTS_RETRY_AFTER_S,
            )

    async def create(self, req: CreateRequest) -> SandboxRecord:
        self._check_timeout(req.timeout_s)
        if req.auto_pause:
            raise Unsupported("autoPause is not supported yet: this node cannot pause sandboxes")
        if req.auto_resume:
            raise Unsupported("autoResume is not supported yet: this node cannot pause sandboxes")
        info = self.runtime.template(req.template)  # TemplateNotFound -> 404
        shape = self._shape(info.shape, req)
        # From the admission check to the insert there is no await: the count stays exact.
        self._admit()
        sid = new_sandbox_id()
        token = new_access_token() if req.secure else None
        now = self.now_us()
        rec = SandboxRecord(
            sandbox_id=sid,
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
            env_vars=dict(req.env_vars),
            access_token=token,
            allow_internet=req.allow_internet,
            updated_at_us=now,
        )
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

    async def _boot(
        self, rec: SandboxRecord, info: TemplateInfo, shape: MachineShape
    ) -> SandboxHandle:
        sid = rec.sandbox_id
        init = AgentInit(access_token=rec.access_token, env_vars=dict(rec.env_vars))
        try:
            async with stage("create", "runtime_create", sid):
                handle = await self.runtime.create(sid, info.template_id, init, shape)
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

    async def _kill_locked(self, rec: SandboxRecord, reason: str) -> None:
        sid = rec.sandbox_id
        if not self.store.transition(sid, [rec.state], S.KILLING, self.now_us()):
            raise StateConflict(f"sandbox {sid} changed state", actual=str(rec.state))
        t0 = time.perf_counter()
        route = self.routes.remove(sid)
        if rec.state in HAS_VM:
            handle = route.handle if route else self._handle(rec)
            async with stage("kill", "runtime_kill", sid):
                await self._runtime_kill(handle)
        self.store.delete(sid, [S.KILLING])
        OPS_TOTAL.labels("kill", reason).inc()
        log_event(log, "sandbox.killed", sandbox_id=sid, reason=reason,
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip

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
        """TTL: kill (pause once it exists and autoPause is set) if endAt has really passed."""
        async with self._locks.hold(sandbox_id):
            rec = self.store.get(sandbox_id)
            if rec is None or rec.state is not S.RUNNING or rec.end_at_us > self.now_us():
                return  # killed or extended meanwhile
            await self._kill_locked(rec, "timeout")

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

    async def connect(self, sandbox_id: str, timeout_s: int) -> tuple[SandboxRecord, bool]:
        """Running: extend-only TTL, (record, False). Paused: resume, (record, True)."""
        self._check_timeout(timeout_s)
        async with self._locks.hold(sandbox_id):
            rec = self.get(sandbox_id)
            if rec.state is S.PAUSED:
                raise Unsupported("resuming a paused sandbox is not supported yet")
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
    def num(key: str, default: float = 0) -> float:
        v = raw.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"agent metric {key!r} is not a number")
        return v

    return MetricSample(
        ts_us=now_us,
        cpu_count=int(num("cpu_count", 1)),
        cpu_used_pct=float(num("cpu_used_pct")),
        mem_used=int(num("mem_used")),
        mem_total=int(num("mem_total")),
        mem_cache=int(num("mem_cache")),
        disk_used=int(num("disk_used")),
        disk_total=int(num("disk_total")),
    )
