"""The node runtime: real microVMs from templates, each in its own jail and network slot.

Creating a sandbox restores its template's snapshot into a fresh QEMU: clone the
snapshot's RAM and disk files into the VM's directory (reflink: no data copied), start
QEMU waiting for an incoming migration, load the device state, continue, and push the
sandbox's identity to the agent's /init. Implements `machines.api.Runtime`; its parts live
in `pausing.py` (pause, resume, the hot tier), `cloning.py` (restores, snapshots, forks,
primed VMs, templates) and `adopting.py` (node restarts).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path

from aenv.config import Config, MachineShape
from aenv.faults import fault
from aenv.machines import adoption, agent_replies, durability, hot
from aenv.machines.adopting import Adopting
from aenv.machines.agent_replies import GuestReplyError
from aenv.machines.api import (
    AGENT_PORT,
    AgentInit,
    CapacityExceeded,
    RuntimeError_,
    SandboxHandle,
    TemplateNotFound,
    VmmExit,
    VmmExitHandler,
    VolumeMount,
)
from aenv.machines.cloning import Cloning
from aenv.machines.guest_trust import TrustError
from aenv.machines.init_gate import InitGate
from aenv.machines.machine import (
    AGENT_BOOT_TIMEOUT,
    AGENT_INIT_BEHIND_TIMEOUT,
    AGENT_INIT_TIMEOUT,
    AGENT_METRICS_TIMEOUT,
    CLOCK_RESYNC_S,
    FORK_PREFIX,
    PRIMED_REFILL_DELAY_S,
    BootError,
    Machine,
    ShapeMismatch,
    exit_of,
    log_tail,
)
from aenv.machines.paging import Pager
from aenv.machines.pausing import Pausing
from aenv.machines.pools import RecentPools, VmPool
from aenv.machines.slot_egress import SlotEgress
from aenv.machines.slot_volumes import SlotVolumes
from aenv.network.egress import EgressPolicy
from aenv.network.pool import SlotPool
from aenv.network.rules import RulesError
from aenv.network.slot import Slot
from aenv.obs import VMM_EXITS, log_event
from aenv.storage import datafs
from aenv.storage.files import clone, remove_tree
from aenv.storage.kernel import kernel_cache_key
from aenv.storage.snapshots import (
    Manifest,
    SnapshotCorrupt,
    SnapshotNotFound,
    SnapshotStore,
    now_rfc3339,
)
from aenv.storage.templates import TemplateCatalog, TemplateMissing
from aenv.vmm.base import Drive, VmmError, VmSpec
from aenv.vmm.cgroup import Cgroup
from aenv.vmm.qemu import QemuDriver

log = logging.getLogger(__name__)
# A page of the guest's journal: 500 entries of up to 4 KiB each, JSON-escaped.
GUEST_LOGS_MAX_BYTES = 4 << 20


class Runtime(Pausing, Cloning, Adopting):
    def __init__(self, cfg: Config,
                 reclaimer: Callable[[Runtime, set[str]], Awaitable[list[str]]] | None = None
                 ) -> None:  # fmt: skip
        self.cfg = cfg
        # What ends an earlier node process's leftovers (the orchestrator's reclaim_runtime,
        # given by its factory: this plane does not import the orchestrator).
        self._reclaimer = reclaimer
        self.driver = QemuDriver(
            binary=cfg.qemu_binary, accel=cfg.accel, tcg_tb_mib=cfg.tcg_tb_mib,
            probe_kernel=cfg.kernel_path,
            cache_dir=cfg.artifacts_dir, memory_overhead_mib=cfg.jail_memory_overhead_mib,
            pids_max=cfg.jail_pids_max, jail_prefix=f"{cfg.instance}-",
        )
        self.snapshots = SnapshotStore(cfg.snapshots_dir)
        self.catalog = TemplateCatalog(cfg.templates_dir)
        self.slots = SlotPool(
            uid_for_index=lambda i: cfg.jail_uid_base + i,
            max_slots=min(cfg.max_slots, cfg.jail_uid_count),
            network=cfg.slot_network,
            prefix=f"{cfg.instance}-",
        )
        self._machines: dict[str, Machine] = {}
        self.egress = SlotEgress(cfg, secret=self._secret)
        self.volumes = SlotVolumes(cfg)  # the slots' NFS servers, for guests with volumes
        # Pooled VMs (pools.py): empty incoming QEMUs for any restore of the default shape,
        # and default-template VMs primed for a create.
        self._pool: VmPool[tuple[object, ...]] = VmPool(
            "warm_pool", cfg.warm_pool_size, self._spawn_incoming, self._destroy, self._watch)
        self._primed: VmPool[str] = VmPool(
            "primed_pool", cfg.primed_pool_size, self.prime, self._destroy, self._watch,
            refill_delay_s=PRIMED_REFILL_DELAY_S)
        # ... and VMs primed from the snapshots created from last (a task's start state that
        # a GRPO group creates from again and again).
        self._primed_snap: RecentPools[str] = RecentPools(
            "primed_snapshot", cfg.primed_snapshot_pool_size, self.prime, self._destroy,
            self._watch, refill_delay_s=PRIMED_REFILL_DELAY_S)
        self.on_vmm_exit: VmmExitHandler | None = None  # the orchestrator's
        # The orchestrator's: (team, name) -> the value of that team's secret.
        self.secret_value: Callable[[str, str], Awaitable[str]] | None = None
        self.hot = hot.HotTier(cfg, self._stop)
        self.pager = Pager(self._machines, self.hot, self._settled)
        self.fsyncs = durability.Durability()  # hot pauses' files, after the answer
        self._tasks: set[asyncio.Task[None]] = set()  # see _background
        self.init_gate = InitGate(cfg.max_concurrent_boots)  # fork children's /init

    # -- lifecycle of the runtime itself ------------------------------------------------
    async def start(self) -> None:
        await asyncio.to_thread(datafs.ensure, self.cfg.data_dir, self.cfg.data_image_size_gib)
        for d in (self.cfg.artifacts_dir, self.cfg.templates_dir, self.cfg.snapshots_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.cfg.sandboxes_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
        for d in (self.cfg.sandboxes_dir, self.cfg.sandboxes_dir.parent):
            d.chmod(0o711)
        if self.driver.probe_kernel is None:
            # The KVM boot probe needs a guest kernel: the one set-up built, if any.
            built = self.cfg.artifacts_dir / "kernel" / kernel_cache_key() / "bzImage"
            self.driver.probe_kernel = built if built.exists() else None
        await asyncio.to_thread(self.driver.check)
        await asyncio.to_thread(durability.settle_all, self.cfg.sandboxes_dir)
        self.snapshots.gc_staging()
        try:
            tpl = self.catalog.get(self.cfg.default_template)
            self._pool.configure(self._pool_key(self.snapshots.get(tpl.snapshot_id)))
            self._primed.configure(tpl.snapshot_id)
        except (TemplateMissing, SnapshotNotFound, SnapshotCorrupt):
            pass  # no default template yet (before `aenv setup`): no pool
        self.hot.start()
        await self.egress.start()
        log.info("runtime ready: driver=%s accel=%s", self.driver.name, self.driver.accel())

    async def close(self) -> None:
        await self.hot.close()
        await self._primed.close()
        await self._primed_snap.close()
        await self._pool.close()
        await asyncio.gather(*(self._destroy(m) for m in list(self._machines.values())))
        self._machines.clear()
        await self.slots.close_async()
        await self.egress.close()
        await self.volumes.close()
        await self.fsyncs.close()

    async def settle_pool(self) -> None:
        """Wait for the pools' VMs in the making: the next restore of the default shape
        then takes a pooled QEMU, the next create of the default template a primed VM
        (reclaim; benchmarks that must not measure QEMU start-up)."""
        await self._pool.settle()
        await self._primed.settle()
        await self._primed_snap.settle()

    async def reclaim(self, keep: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
        """Recovery's extension point (`orchestrator.recovery`): everything of this instance
        but what this process runs and the directories of the sandboxes in `keep`."""
        return [] if self._reclaimer is None else await self._reclaimer(self, set(keep))

    def live_vms(self) -> set[str]:
        """Jail names of every VM this process runs: sandboxes (adopted ones too), hot
        VMMs and pooled VMs. What a reclaim must leave alone (`orchestrator.reclaim`)."""
        hot_vms = [h.machine for n in self.hot.names() if (h := self.hot.get(n))]
        return ({m.jail for m in [*self._machines.values(), *hot_vms]} | self._pool.names()
                | self._primed.names() | self._primed_snap.names())

    def kept_dirs(self) -> set[str]:
        """VM directory names in use: the VMs' own and their sandboxes' (symlinks)."""
        return set(self._machines) | self.hot.names() | self.live_vms()

    def cgroup(self, name: str) -> Cgroup:
        m = self._machines.get(name)
        return Cgroup(self.driver.jail_prefix + (m.jail if m else name))

    def accel(self) -> str:
        return self.driver.accel().value

    # -- machines ----------------------------------------------------------------------
    async def _prepare(self, name: str, *, fresh: bool = True) -> tuple[Slot, Path]:
        if name in self._machines:
            raise RuntimeError_(f"a VM named {name} already exists")
        slot = await self.slots.acquire_async()
        workdir = self.cfg.sandboxes_dir / name
        try:
            if fresh:
                if workdir.exists():
                    remove_tree(workdir)
                workdir.mkdir(mode=0o700)
            os.chown(workdir, slot.tap_uid, slot.tap_uid)
        except BaseException:
            await self.slots.release_async(slot)
            raise
        return slot, workdir

    def _spec(self, slot: Slot, workdir: Path, shape: MachineShape, kernel: Path, tools: Path,
              cmdline: str) -> VmSpec:
        return VmSpec(
            shape=shape, workdir=workdir, kernel=kernel, cmdline=cmdline,
            drives=[Drive(tools, read_only=True), Drive(workdir / "disk", read_only=False)],
            net=slot.net_attachment(), uid=slot.tap_uid,
        )

    def _own(self, path: Path, uid: int) -> None:
        os.chown(path, uid, uid)
        path.chmod(0o600)

    async def cold_boot(self, name: str, shape: MachineShape, kernel: Path, tools: Path,
                        rootfs: Path, cmdline: str) -> Machine:
        """Boot a VM from a kernel and a rootfs image (template builds)."""
        slot, workdir = await self._prepare(name)
        try:
            await asyncio.to_thread(clone, rootfs, workdir / "disk")
        except BaseException:
            await self._release(slot, workdir)
            raise
        return await self._boot_disk(name, name, slot, workdir, shape, kernel, tools, cmdline,
                                     keep_dir=False)  # fmt: skip

    async def _boot_disk(self, name: str, template_id: str, slot: Slot, workdir: Path,
                         shape: MachineShape, kernel: Path, tools: Path, cmdline: str, *,
                         keep_dir: bool) -> Machine:
        """Cold-boot the disk already in `workdir` with a fresh (sparse, empty) RAM file and
        wait for the agent. On failure the VMM and slot go, and the directory too unless
        `keep_dir` (a reboot-resume: the disk is the paused sandbox's state)."""
        spec = self._spec(slot, workdir, shape, kernel, tools, cmdline)
        try:
            with open(spec.memory_file, "wb") as f:
                f.truncate(shape.memory_mib << 20)
            for f in (workdir / "disk", spec.memory_file):
                self._own(f, slot.tap_uid)
            vm = await self.driver.spawn(spec, incoming=False)
        except BaseException:
            await self._release(slot, None if keep_dir else workdir)
            raise
        m = Machine(name, vm, slot, workdir, template_id, jail=name)
        self._register(m)
        try:
            await vm.boot()
            await self.wait_agent(m, AGENT_BOOT_TIMEOUT)
        except BaseException:
            if keep_dir:
                await self._stop(m)
            else:
                await self.destroy(name)
            raise
        return m

    def _manifest(self, snapshot_id: str) -> Manifest:
        try:
            return self.snapshots.get(snapshot_id)
        except (SnapshotNotFound, SnapshotCorrupt) as e:
            raise TemplateNotFound(f"snapshot {snapshot_id} is not usable: {e}") from e

    @staticmethod
    def _pool_key(man: Manifest) -> tuple[object, ...]:
        # The incoming side must match the source: shape, and the drives and kernel the
        # guest has in use.
        return (man.shape, man.kernel, man.tools, man.cmdline)

    async def wait_agent(self, m: Machine, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        url = m.slot.url(AGENT_PORT) + "/health"
        last: Exception | None = None
        while time.monotonic() < deadline:
            if m.name not in self._machines:
                raise BootError(f"{m.name} was destroyed while booting")
            if m.exited is not None:
                raise BootError(f"the VMM of {m.name} exited ({m.exited}): {log_tail(m.vm)}")
            try:
                r = await agent_replies.request(m.http, "GET", url, deadline_s=1.0)
                if r.status == 204:
                    return
            except GuestReplyError as e:
                last = e
            await asyncio.sleep(0.05)
        try:
            tail = await m.vm.console_tail()
        except VmmError as e:
            tail = f"(unreadable: {e})"
        raise BootError(f"agent did not answer within {timeout:.0f}s ({last}); console:\n{tail}")

    async def serve_volumes(self, sandbox_id: str, mounts: list[VolumeMount]) -> None:
        """The volume server of an adopted sandbox's slot (the last node process's ended
        with it): its guest's kernel reconnects by itself."""
        m = self._machines.get(sandbox_id)
        if m is not None and mounts:
            await self.volumes.serve(m.slot, mounts)

    async def set_egress(self, sandbox_id: str, policy: EgressPolicy) -> bool:
        """A live update: `policy` onto the slot of the sandbox's running or hot-paused VM.
        False if no VM of it holds a slot (paused cold): its next start applies the policy.
        Raises OSError or RulesError (the slot keeps its rules)."""
        h = self.hot.get(sandbox_id)
        m = self._machines.get(sandbox_id) or (h.machine if h else None)
        if m is None:
            return False
        async with m.net_lock:
            if m.stopping:
                return False
            await self.egress.apply(m.slot, policy, fresh=False)
            if policy.rules:
                try:
                    await self.egress.trust(m.http, m.slot, m.access_token)
                except TrustError as e:
                    raise OSError(f"the guest could not be made to trust the egress CA: {e}"
                                  ) from e  # fmt: skip
        return True

    @property
    def egress_ca(self) -> tuple[str, str]:
        """The egress CA's certificate and key (PEM): what guests with rules trust."""
        return self.egress.ca

    def use_egress_ca(self, cert: str, key: str) -> None:
        """Sign with the cluster's CA from now on (cluster/secrets.py)."""
        self.egress.use_ca(cert, key)

    async def _secret(self, team_id: str, name: str) -> str:
        if self.secret_value is None:
            raise LookupError(name)
        return await self.secret_value(team_id, name)

    async def push_init(self, m: Machine, init: AgentInit,
                        deadline_s: float | None = None) -> None:
        """Identity, env and fresh entropy for the guest; one attempt, no retry: a restored
        guest must answer its first request (fixed MACs make any slot look the same).
        First the sandbox's egress policy goes onto its slot (every start comes here). Its
        VMM runs before idle ones meanwhile (a burst's last creates wait on it)."""
        with Cgroup(self.driver.jail_prefix + m.jail).first():
            await self._push_init(m, init, deadline_s)

    async def _push_init(self, m: Machine, init: AgentInit, deadline_s: float | None) -> None:
        try:
            await self.egress.apply(m.slot, init.egress, fresh=True)
        except (OSError, RulesError) as e:
            raise BootError(f"applying the egress policy failed: {e}") from e
        body: dict[str, object] = {
            "envVars": init.env_vars,
            "defaultUser": init.default_user,
            "timestamp": now_rfc3339(),
            "aenvEntropy": base64.b64encode(secrets.token_bytes(64)).decode(),
            # Always: none clears a token the snapshot's agent holds (a primed VM's own).
            "accessToken": init.access_token or None,
        }
        if init.default_workdir:
            body["defaultWorkdir"] = init.default_workdir
        if init.volumes:
            body["aenvVolumes"] = await self.volumes.serve(m.slot, init.volumes)
        t0 = time.monotonic()
        try:
            # The whole budget for connecting too: a guest restored next to many others
            # (fork x16 under TCG) may take seconds to be scheduled and accept.
            r = await agent_replies.request(m.http, "POST", m.slot.url(AGENT_PORT) + "/init",
                                            json=body,
                                            deadline_s=deadline_s or AGENT_INIT_TIMEOUT)
        except GuestReplyError as e:
            raise BootError(f"agent /init failed: {e}") from e
        if r.status >= 300:
            raise BootError(f"agent /init answered {r.status}: {r.snippet()}")
        if time.monotonic() - t0 > CLOCK_RESYNC_S:
            await self._push_clock(m)  # the guest set a time that was old by then
        if init.egress.rules:  # before the client gets it: its first request may be ruled
            try:
                await self.egress.trust(m.http, m.slot, init.access_token)
            except TrustError as e:
                raise BootError(f"the guest could not be made to trust the egress CA: {e}"
                                ) from e  # fmt: skip
        m.access_token = init.access_token
        # From here on a client may hold this VM: a node restart re-adopts it.
        try:
            rec = self._adoption_record(m)
        except ProcessLookupError as e:
            raise BootError(f"the VMM ended: {e}") from e
        await asyncio.to_thread(adoption.write, m.workdir, rec)

    async def destroy(self, name: str) -> None:
        """End the VM (if any) and delete everything of it, paused state included."""
        await self.fsyncs.wait(name)
        h = self.hot.forget(name)
        m = self._machines.pop(name, None) or (h.machine if h else None)
        if m is not None:
            await self._destroy(m)
        else:
            await self.hot.ended(name)  # a demotion tearing its jail down
            await asyncio.to_thread(remove_tree, self.cfg.sandboxes_dir / name)

    async def _stop(self, m: Machine) -> None:
        """End the VMM and give back its slot, keeping its directory (pause)."""
        m.stopping = True  # before anything ends it: its watcher must not report the exit
        self._machines.pop(m.name, None)
        # A child's /init still on its way ends first: it retries connecting to the slot's
        # address until its deadline, and once the slot is given back that address is the
        # next VM's, whose agent would take this one's token (and egress rules).
        if m.ready is not None and not m.ready.done() and m.ready is not asyncio.current_task():
            m.ready.cancel()
            with contextlib.suppress(BaseException):
                await m.ready
        await m.http.aclose()
        with contextlib.suppress(OSError):  # it names a VMM that is about to end
            await asyncio.to_thread(adoption.remove, m.workdir)
        with contextlib.suppress(Exception):
            await m.vm.kill()
        async with m.net_lock:  # an egress update in flight ends first
            self.egress.forget(m.slot)
            await self._give_back(m.slot)

    async def _destroy(self, m: Machine) -> None:
        await self._stop(m)
        await asyncio.to_thread(remove_tree, m.workdir)

    async def _release(self, slot: Slot, workdir: Path | None) -> None:
        if workdir is not None:
            await asyncio.to_thread(remove_tree, workdir)
        await self._give_back(slot)

    async def _give_back(self, slot: Slot) -> None:
        await self.volumes.unserve(slot)
        await self.slots.release_async(slot)

    def _background(self, work: Coroutine[object, object, None]) -> None:
        """Run `work` without waiting for it (held here: the loop keeps only weak refs)."""
        t = asyncio.get_running_loop().create_task(work)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # -- VMMs that exit on their own ----------------------------------------------------
    def _register(self, m: Machine) -> None:
        """`m` is the VM of sandbox `m.name` from now on; its VMM is watched."""
        self._machines[m.name] = m
        self._watch(m, self._sandbox_vmm_exited)

    def _watch(self, m: Machine, died: Callable[[Machine, VmmExit], None]) -> None:
        """Call `died` when m's VMM exits and the node did not end it (`m.stopping`)."""
        m.watcher = asyncio.get_running_loop().create_task(
            self._watcher(m, died), name=f"aenv-vmm-{m.name}")

    async def _watcher(self, m: Machine, died: Callable[[Machine, VmmExit], None]) -> None:
        try:
            returncode = await m.vm.wait()
            if m.stopping:
                return
            # Read before anything removes the VM's cgroup (its OOM count).
            m.exited = exit_of(m.vm, returncode, Cgroup(self.driver.jail_prefix + m.jail))
            log_event(log, "vmm.exited", logging.WARNING, vm=m.name,
                      exit_code=m.exited.exit_code, signal=m.exited.signal,
                      oom_killed=m.exited.oom_killed or None,
                      qemu_log=log_tail(m.vm) or None)  # fmt: skip
            died(m, m.exited)
        except Exception:
            log.exception("watching the VMM of %s failed", m.name)

    def _sandbox_vmm_exited(self, m: Machine, how: VmmExit) -> None:
        VMM_EXITS.labels("sandbox").inc()
        h = self.hot.get(m.name)
        if h is not None and h.machine is m:
            # A hot VMM died: its sandbox stays paused, cold (the state on disk is whole).
            self.hot.forget(m.name)
            self._background(self._stop(m))
            return
        # Only the sandbox's current VM: the orchestrator removes the sandbox (a kill).
        if self._machines.get(m.name) is m and self.on_vmm_exit is not None:
            self.on_vmm_exit(m.name, how)

    # -- the sandbox API the orchestrator uses ------------------------------------------
    async def create(self, sandbox_id: str, template: str, init: AgentInit,
                     shape: MachineShape | None = None, *,
                     init_later: bool = False) -> SandboxHandle:  # fmt: skip
        """From a template name or a snapshot id (`init_later`: as a fork child's)."""
        try:
            info = self._template_info(template)
            snapshot_id, template_shape = info.build_id, info.shape
        except TemplateNotFound:
            snapshot_id = template
            template_shape = self._manifest(template).shape
        if shape is not None and shape != template_shape:
            raise ShapeMismatch(
                f"template {template} is built for {template_shape}; other shapes need a build")
        if len(self._machines) >= self.cfg.max_sandboxes:
            raise CapacityExceeded("node is at its sandbox limit")
        await self.pager.make_room(template_shape.memory_mib)
        if init_later:
            return await self._create_from(sandbox_id, snapshot_id, init,
                                           init_gate=self.init_gate)  # fmt: skip
        await self._create_from(sandbox_id, snapshot_id, init)
        return self.handle(sandbox_id, template)

    async def _create_from(self, sandbox_id: str, snapshot_id: str, init: AgentInit, *,
                           init_gate: InitGate | None = None) -> SandboxHandle:
        """With `init_gate`, the /init is pushed in the background under that gate and the
        handle's `ready` is done once it is (a fork child)."""
        try:
            primed = self._primed.take(snapshot_id) or self._primed_snap.take(snapshot_id)
            self._follow_snapshot(snapshot_id)
            if primed is not None:
                m = await self._continue_primed(sandbox_id, primed)
            elif self._manifest(snapshot_id).memory:
                m = await self.restore(sandbox_id, snapshot_id)
            else:
                m = await self._boot_snapshot(sandbox_id, snapshot_id)
            fault("create.before_init")
            if init_gate is None:
                await self.push_init(m, init)
        except VmmError as e:
            await self.destroy(sandbox_id)
            raise BootError(str(e)) from e
        except BaseException:
            await self.destroy(sandbox_id)
            raise
        handle = self.handle(sandbox_id, m.template_id)
        if init_gate is not None:
            t = asyncio.get_running_loop().create_task(self._init_later(m, init, init_gate))
            t.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved
            m.ready = handle.ready = t
            handle.hurry = lambda: init_gate.hurry(sandbox_id)
        return handle

    async def _init_later(self, m: Machine, init: AgentInit, gate: InitGate) -> None:
        """A child's /init behind the call. If it fails the VM is ended and reported as a
        dead VMM, so the orchestrator removes the sandbox; the data plane answers 502."""
        t0 = time.perf_counter()
        try:
            async with gate.hold(m.name):
                t1 = time.perf_counter()
                await self.push_init(m, init, AGENT_INIT_BEHIND_TIMEOUT)
            log.debug("sandbox %s: /init behind the call, %.0f ms after %.0f ms for the gate",
                      m.name, (time.perf_counter() - t1) * 1000, (t1 - t0) * 1000)
        except asyncio.CancelledError:  # the VM is being stopped: its /init goes with it
            raise
        except BaseException as e:
            log_event(log, "sandbox.init_failed", logging.WARNING, sandbox_id=m.name,
                      error=repr(e))  # fmt: skip
            if self._machines.get(m.name) is m:
                await self.destroy(m.name)
                if self.on_vmm_exit is not None:
                    self.on_vmm_exit(m.name, VmmExit())
            raise

    @staticmethod
    async def _settled(m: Machine) -> None:
        """Wait for what a start left running behind its call (a child's /init, a hot
        resume's clock push): not into a stopped guest."""
        if m.ready is not None:
            with contextlib.suppress(Exception):
                await m.ready

    def _follow_snapshot(self, snapshot_id: str) -> None:
        """Prime VMs of a user snapshot a create just used (not a template's, nor a fork's
        transient one, nor a filesystem-only one): the pools favour the newest."""
        if snapshot_id.startswith(FORK_PREFIX) or snapshot_id == self._primed.key:
            return
        with contextlib.suppress(SnapshotNotFound, SnapshotCorrupt):
            man = self.snapshots.get(snapshot_id)
            if man.parent is not None and man.memory:
                self._primed_snap.use(snapshot_id)

    def handle(self, name: str, template_id: str) -> SandboxHandle:
        m = self._machines[name]
        return SandboxHandle(
            sandbox_id=name, template_id=template_id, shape=m.vm.spec.shape,
            slot_addr=m.slot.slot_addr, vmm_pid=m.vm.pid,
        )

    async def kill(self, handle: SandboxHandle) -> None:
        """Kill a running or paused sandbox and delete its files."""
        await self.destroy(handle.sandbox_id)

    async def agent_metrics(self, handle: SandboxHandle) -> dict[str, object]:
        return await self._agent_get(handle, "/metrics")  # checked by the caller

    async def agent_logs(self, handle: SandboxHandle, after: int) -> dict[str, object]:
        return await self._agent_get(handle, f"/aenv/logs?after={after}",
                                     max_bytes=GUEST_LOGS_MAX_BYTES)  # fmt: skip

    async def _agent_get(self, handle: SandboxHandle, path: str,
                         max_bytes: int = agent_replies.MAX_REPLY_BYTES) -> dict[str, object]:
        m = self._machines.get(handle.sandbox_id)
        if m is None:
            raise RuntimeError_(f"sandbox {handle.sandbox_id} is not running")
        return await agent_replies.get_object(m.http, handle.url() + path, m.access_token,
                                              deadline_s=AGENT_METRICS_TIMEOUT,
                                              max_bytes=max_bytes)  # fmt: skip

    def machines(self) -> dict[str, Machine]:
        return dict(self._machines)
