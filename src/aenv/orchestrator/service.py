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
import socket
import time
from collections.abc import Awaitable, Callable

from aenv import faults, obs
from aenv.config import Config, MachineShape
from aenv.faults import fault
from aenv.machines.api import Runtime, SandboxHandle, TemplateInfo, VmmExit
from aenv.machines.hot import memory_budget_mib
from aenv.network.egress import EgressPolicy
from aenv.obs import OPS_TOTAL, log_event, stage
from aenv.orchestrator import (
    background,
    memory_pressure,
    mounts,
    recovery,
    space,
)
from aenv.orchestrator import rollback as rollbacks
from aenv.orchestrator import snapshots as snaps
from aenv.orchestrator.admission import Admission
from aenv.orchestrator.boots import BootSlots
from aenv.orchestrator.errors import (
    InvalidRequest,
    NotFound,
    ShuttingDown,
    StateConflict,
)
from aenv.orchestrator.forking import Forking
from aenv.orchestrator.images import ImageTemplates
from aenv.orchestrator.locks import Joiner, SandboxLocks
from aenv.orchestrator.memory_admission import MemoryAdmission
from aenv.orchestrator.networking import Networking
from aenv.orchestrator.observing import Observing
from aenv.orchestrator.orphans import CreateKeys, Orphans
from aenv.orchestrator.pausing import Pausing
from aenv.orchestrator.pending import PendingTemplates
from aenv.orchestrator.reachability import Reachability
from aenv.orchestrator.requests import (
    AUTO_PAUSE_RETRY_S,
    MAX_REFRESH_S,
    CreateRequest,
    agent_init,
    new_access_token,
    new_sandbox_id,
)
from aenv.orchestrator.routes import PUBLIC, Ingress, RouteTable
from aenv.orchestrator.sandbox_logs import SandboxLogs
from aenv.orchestrator.states import HAS_VM, HOLDS_CAPACITY, PUBLIC_STATE, SandboxState
from aenv.orchestrator.store import ListQuery, SandboxRecord, Store
from aenv.secrets.sealing import Sealer
from aenv.secrets.store import Secrets, SecretStore
from aenv.secrets.vault import Vault, key_path, load_key
from aenv.teams import names
from aenv.teams.store import Teams, TeamStore
from aenv.volumes.store import Volumes, VolumeStore

RETRIED_CREATE_WAIT_S = 300.0  # at most this for the create a retried one waits for

log = logging.getLogger("aenv.orchestrator")
S = SandboxState



class Orchestrator(Admission, Pausing, Forking, Networking, Observing):
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
        # The node's own key: its database's sealed values (secrets, what grants access in a
        # record). A cluster's key, which replaces `secrets_key` on joining, seals what
        # leaves the node; the database stays under this one.
        own_key = load_key(key_path(config))
        self.store = Store(config.db_path, Sealer.of_key(own_key))
        self.routes = RouteTable()
        self.reachability = Reachability(self.now_us)  # the metrics sampler's probes
        # Creates nobody received (their client left): removed (orchestrator/orphans.py).
        self.create_keys = CreateKeys()
        self.orphans = Orphans(self.kill)
        self.client_id = socket.gethostname() or "aenv"
        self._clock = clock
        self._locks = SandboxLocks(config.transition_wait_s)
        self._joiner = Joiner()
        self.boots = BootSlots(config.max_concurrent_boots, config.admission_queue_s)
        self.memory = MemoryAdmission(memory_budget_mib(config), config.memory_overcommit)
        self._accepting = False
        # Held off for a while, not shutting down: fenced (cut off from the cluster: nothing
        # starts a VM) or draining (no new sandboxes; those it has go on).
        self._fenced = False
        self._draining = False
        self._tasks: list[asyncio.Task[None]] = []
        self._expiring: set[str] = set()
        # Removals of sandboxes whose VMM exited on its own (background.reap_dead_vmm).
        self._reaping: set[asyncio.Task[None]] = set()
        self._started = False
        self._closing = False
        self._snap_refs = snaps.SnapshotRefs()
        # Templates on their way (builds, pulls, fetches): creates naming them wait.
        self.pending = PendingTemplates(config.template_wait_s)
        self.shared: snaps.Shared | None = None  # set by the cluster plane (cluster/node.py)
        self.images: ImageTemplates | None = None  # images on demand (the node's, api/app.py)
        self.logs: SandboxLogs | None = None  # each sandbox's log, from start()
        self.secrets: Secrets | None = None  # from start(); a cluster's replaces it
        self.secrets_key = own_key  # the node's; its cluster's once it joins
        self.volumes: Volumes | None = None  # from start()
        self.teams: Teams | None = None  # from start(); a cluster's replaces it
        # Run at close, after the last pause and VM and before the store closes: the
        # cluster's bindings then say what shutdown left (cluster/node.py).
        self.on_stopped: list[Callable[[], Awaitable[None]]] = []
        # Free bytes on the data filesystem (space admission); tests replace it.
        self.free_bytes: Callable[[], int] = lambda: space.free_bytes(config.data_dir)

    # -- time ------------------------------------------------------------------------------

    def now_us(self) -> int:
        return int(self._clock() * 1_000_000)

    # -- lifecycle -------------------------------------------------------------------------

    async def _secret_value(self, team_id: str, name: str) -> str:
        if self.secrets is None:
            raise LookupError(name)
        return await self.secrets.value(team_id, name)

    async def start(self) -> None:
        faults.arm(self.config.faults)  # crash tests only; empty: every point is a no-op
        self.store.open()
        self.logs = SandboxLogs(self.store.db)
        # Secrets live in the node's database, sealed under the node's key.
        self.secrets = SecretStore(self.store.db, Vault(self.secrets_key))
        self.volumes = VolumeStore(self.store.db, self.config.volumes_dir)
        self.teams = TeamStore(self.store.db)
        # The egress proxy fills rules with them (whichever store holds them by then).
        self.runtime.secret_value = self._secret_value
        obs.SANDBOX_EVENTS.append(self.logs.capture)
        self.runtime.on_vmm_exit = self._vmm_exited  # adopted VMs are watched too
        async with stage("node", "runtime_start"):
            await self.runtime.start()
        await recovery.recover(self)
        self._tasks = [
            asyncio.create_task(background.ttl_sweeper(self), name="aenv-ttl"),
            asyncio.create_task(background.metrics_sampler(self), name="aenv-metrics"),
            asyncio.create_task(background.snapshot_checksums(self), name="aenv-checksums"),
            asyncio.create_task(background.scrubber(self), name="aenv-scrub"),
            asyncio.create_task(background.idle_reclaimer(self), name="aenv-reclaim"),
        ]
        self._accepting = True
        self._started = True
        log_event(log, "node.started", sandboxes=len(self.routes))

    @property
    def accepting(self) -> bool:
        """False once shutdown began, or while fenced or draining: no new sandboxes."""
        return self._accepting and not self._fenced and not self._draining

    @property
    def fenced(self) -> bool:
        return self._fenced

    def _refuse(self, *, new: bool) -> None:
        """ShuttingDown (503) if the node takes no VM start now; `new`: a new sandbox (a
        create or fork), which draining refuses too, rather than a resume."""
        if not self._accepting:
            raise ShuttingDown("the node is shutting down")
        if self._fenced:
            raise ShuttingDown("the node is cut off from its cluster (fenced)")
        if new and self._draining:
            raise ShuttingDown("the node is draining")


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
        await self.orphans.close()
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
        for hook in self.on_stopped:
            try:
                await hook()
            except Exception:
                log.exception("node.stop_hook_failed")
        self._stop_logs()
        self.store.close()
        log_event(log, "node.stopped", killed=len(doomed))

    def _stop_logs(self) -> None:
        if self.logs is not None:
            with contextlib.suppress(ValueError):
                obs.SANDBOX_EVENTS.remove(self.logs.capture)
            self.logs.flush()

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

    def templates(self, *, usage: bool = False, fetched: bool = False) -> list[TemplateInfo]:
        """This node's templates; with `fetched`, the copies it fetched from others too."""
        return [t for t in self.runtime.templates(usage=usage) if fetched or not t.fetched]

    def template(self, name: str) -> TemplateInfo:
        return self.runtime.template(name)

    def get(self, sandbox_id: str) -> SandboxRecord:
        rec = self.store.get(sandbox_id)
        if rec is None or rec.state not in PUBLIC_STATE:
            raise NotFound(f"sandbox \"{sandbox_id}\" doesn't exist or you don't have access to it")
        return rec

    def list(self, q: ListQuery) -> tuple[list[SandboxRecord], tuple[int, str] | None]:
        return self.store.list(q)

    async def owned_by(self, team_id: str) -> list[str]:
        """What the team still owns, in words (empty: nothing; a team is deleted only so)."""
        n = len([r for r in self.store.all() if r.team_id == team_id])
        owned = [f"{n} sandbox(es)"] if n else []
        if t := len([t for t in self.runtime.templates()
                     if names.SEP in t.template_id and names.owns(t.template_id, team_id)]):
            owned.append(f"{t} template(s)")
        if s := len(self._snapshots(team_id)):
            owned.append(f"{s} snapshot(s)")
        if self.volumes is not None and (v := self.volumes.count(team_id)):
            owned.append(f"{v} volume(s)")
        if self.secrets is not None and (c := await self.secrets.count(team_id)):
            owned.append(f"{c} secret(s)")
        return owned

    def stats(self) -> dict[SandboxState, int]:
        return self.store.count_by_state()

    # -- create ----------------------------------------------------------------------------

    async def create(self, req: CreateRequest) -> SandboxRecord:
        self._check_timeout(req.timeout_s)
        if req.auto_resume and not req.auto_pause:
            raise InvalidRequest("autoResume needs autoPause: only a paused sandbox resumes")
        if req.auto_resume and not req.auto_pause_memory:
            raise InvalidRequest("autoResume cannot be combined with autoPauseMemory false: a "
                                 "filesystem-only pause reboots on resume, so it is resumed "
                                 "only by connect")  # fmt: skip
        egress = self.egress_for(req.allow_internet, req.allow_out, req.deny_out,
                                 req.dns_servers, req.egress_proxy, req.rules)  # fmt: skip
        ingress = self.ingress_for(req)
        await self.check_egress(egress, req.team_id)
        image = self.images.image_in(req.metadata) if self.images is not None else None
        if image is not None:  # the operator's metadata key names the image to boot
            assert self.images is not None
            info = await self._resolve(await self.images.template_for(image, req.team_id),
                                       req.team_id)  # fmt: skip
        else:
            info = await self._resolve(req.template, req.team_id)  # TemplateNotFound: 404
        volume_mounts = await mounts.resolve(self.volumes, req.volume_mounts, req.team_id)
        shape = self._shape(info.shape, req)
        await memory_pressure.relieve(self, shape.memory_mib)
        await self.boots.wait()  # a burst past max_concurrent_boots queues (orchestrator/boots.py)
        # From the admission check to the insert there is no await: the count stays exact.
        if req.sandbox_id is not None and (req.existing_only or self.store.get(req.sandbox_id)):
            return await self._made(req.sandbox_id)
        self._admit(shape.memory_mib, "create a sandbox", team_id=req.team_id)
        rec = self._new_record(req, info, shape, egress, ingress)
        rec.volume_mounts = mounts.merge(rec.volume_mounts, volume_mounts)
        sid = rec.sandbox_id
        self.store.insert(rec)
        t0 = time.perf_counter()
        try:
            with self.boots.held():
                async with self._locks.hold(sid):
                    handle = await self._boot(rec, info, shape)
        except BaseException:
            OPS_TOTAL.labels("create", "error").inc()
            raise
        OPS_TOTAL.labels("create", "ok").inc()
        log_event(log, "sandbox.created", sandbox_id=sid, template=info.template_id,
                  vcpus=shape.vcpus, memory_mib=shape.memory_mib, slot=handle.slot_addr,
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip
        return self.get(sid)

    async def _made(self, sandbox_id: str) -> SandboxRecord:
        """A gateway's create, retried under the id it placed (its idempotency key, or a
        gateway that died mid-request): the sandbox that create made, once its boot ends;
        409 if it has ended (or its boot failed)."""
        deadline = time.monotonic() + RETRIED_CREATE_WAIT_S
        while (rec := self.store.get(sandbox_id)) is not None and rec.state is S.CREATING:
            if time.monotonic() > deadline:
                raise StateConflict(f"sandbox {sandbox_id} is still being created")
            await asyncio.sleep(0.05)
        if rec is None or rec.state not in PUBLIC_STATE:
            raise StateConflict(f"the sandbox this create made ({sandbox_id}) no longer exists")
        return rec

    def _new_record(self, req: CreateRequest, info: TemplateInfo, shape: MachineShape,
                    egress: EgressPolicy, ingress: Ingress = PUBLIC) -> SandboxRecord:
        now = self.now_us()
        return SandboxRecord(
            sandbox_id=req.sandbox_id or new_sandbox_id(),
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
            ingress=ingress,
            updated_at_us=now,
            default_user=info.user,
            default_workdir=info.workdir,
            volume_mounts=mounts.of_snapshot(self.store.db, info.template_id)
            if info.template_id == info.build_id else [],  # a snapshot: its source's
            team_id=req.team_id,
        )

    async def _boot(
        self, rec: SandboxRecord, info: TemplateInfo, shape: MachineShape
    ) -> SandboxHandle:
        sid = rec.sandbox_id
        init = agent_init(rec, self.config.volumes_dir)
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
        self.routes.add(handle, rec.access_token, rec.ingress)
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
        if self._start_cmd_of(rec):  # what it printed since its log was last read: kept
            await self.pull_guest_logs(sid)
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

    async def rollback(self, sandbox_id: str, snapshot_id: str) -> SandboxRecord:
        """Put a running sandbox back into a snapshot's state, same id and token."""
        return await rollbacks.rollback(self, sandbox_id, snapshot_id)

    # -- pause / resume --------------------------------------------------------------------

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
