"""The node runtime: real microVMs from templates, each in its own jail and network slot.

Creating a sandbox restores its template's snapshot into a fresh QEMU: clone the
snapshot's RAM and disk files into the VM's directory (reflink: no data copied), start
QEMU waiting for an incoming migration, load the device state, continue, and push the
sandbox's identity to the agent's /init. Implements `runtime_api.Runtime`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from aenv.config import Config, MachineShape
from aenv.faults import fault
from aenv.network.addressing import guest_ip_cmdline
from aenv.network.pool import SlotPool, SlotPoolError
from aenv.network.rules import RulesError
from aenv.network.slot import Slot, set_egress
from aenv.orchestrator import adoption, agent_replies, guest_flush, hot
from aenv.orchestrator import reclaim as reclaim_mod
from aenv.orchestrator.agent_replies import GuestReplyError
from aenv.orchestrator.obs import RESUMES, VMM_EXITS, log_event
from aenv.orchestrator.pools import VmPool
from aenv.orchestrator.runtime_api import (
    AGENT_PORT,
    AgentInit,
    CapacityExceeded,
    GuestUnresponsive,
    RuntimeError_,
    SandboxHandle,
    SnapshotInfo,
    TemplateInfo,
    TemplateNotFound,
    VmmExit,
    VmmExitHandler,
)
from aenv.storage import datafs
from aenv.storage.checksums import sha256_file
from aenv.storage.extents import tree_usage
from aenv.storage.files import clone, fsync_path, remove_tree, write_json_atomic
from aenv.storage.kernel import kernel_cache_key
from aenv.storage.snapshots import (
    Manifest,
    SnapshotCorrupt,
    SnapshotNotFound,
    SnapshotStore,
    SnapshotUnusable,
    check_restorable,
    now_rfc3339,
)
from aenv.storage.templates import TemplateCatalog, TemplateMissing
from aenv.vmm import jail
from aenv.vmm.base import Drive, Vm, VmmError, VmSpec
from aenv.vmm.cgroup import Cgroup
from aenv.vmm.qemu import QemuDriver, QemuVm, host_tsc_khz

log = logging.getLogger(__name__)

# A fork's snapshot is transient: it lives only while its children are restored.
FORK_PREFIX = "fork-"
AGENT_BOOT_TIMEOUT = 180.0  # a cold boot under TCG: kernel ~1 s, Python agent start far more
AGENT_INIT_TIMEOUT = 10.0
# An /init answered later than this set a clock that was already behind: send it again.
CLOCK_RESYNC_S = 0.2
# Adopting a VM after a node restart: a running guest answers at once, but one a save left
# stopped first finishes that migration and continues, on a host that may be busy.
ADOPT_VMM_TIMEOUT = 30.0
ADOPT_AGENT_TIMEOUT = 20.0
AGENT_METRICS_TIMEOUT = 2.0  # a sample, skipped when late
# A filesystem-only pause waits this long for the guest's `sync` (a busy TCG guest with
# dirty pages to write may take seconds); a strict pause this long for /health first.
GUEST_FLUSH_TIMEOUT = 20.0
GUEST_CHECK_TIMEOUT = 5.0
# In a paused VM's directory: {"memory": bool}, what its paused state holds.
PAUSE_MARKER = "pause.json"
# Priming a VM takes ~0.5 s of CPU under TCG: not while the one just taken runs its /init
# and its user's first commands.
PRIMED_REFILL_DELAY_S = 1.0
POOL_PREFIX = "pool-"  # VMs a node holds without a record (census.UNRECORDED_VMS)


class BootError(RuntimeError_):
    status = 500


class ShapeMismatch(RuntimeError_):
    status = 400


class PausedStateMissing(RuntimeError_):
    status = 409


class UnusableSnapshot(RuntimeError_):
    """A restore refused: the snapshot (or paused state) is marked corrupt or its device
    state is not the one saved."""

    status = 409
    error_code = "snapshot_corrupt"  # E2B's machine-readable `error_code` in the body


def kernel_cmdline(extra: str = "") -> str:
    parts = [
        "console=ttyS0", "reboot=t", "panic=-1", "quiet", "loglevel=4",
        # tsc=reliable: under a busy TCG host the clocksource watchdog can otherwise mark the
        # TSC unstable and leave the guest on jiffies.
        f"tsc_early_khz={host_tsc_khz()}", "tsc=reliable", "root=/dev/vda", "ro", "rootfstype=ext4",
        "init=/init", guest_ip_cmdline(), "random.trust_cpu=on", "8250.nr_uarts=1",
    ]
    return " ".join(parts + ([extra] if extra else []))


@dataclass
class Machine:
    """One VM with the slot and directory it holds."""

    name: str
    vm: Vm
    slot: Slot
    workdir: Path
    template_id: str = ""
    jail: str = ""  # the VM's cgroup/jail name (a pooled VM keeps its pool name)
    access_token: str | None = None  # the agent enforces it on everything but /health, /init
    # Connections to the agent live and die with this VM: a slot address is reused by the
    # next VM, and a kept-alive connection to the previous guest would hang.
    http: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(
        timeout=httpx.Timeout(AGENT_INIT_TIMEOUT, connect=1.0)))
    # Set before the node itself ends the VMM (kill, pause, shutdown, a failed start): its
    # exit is then expected. A VMM that exits without it died on its own (`exited`).
    stopping: bool = False
    exited: VmmExit | None = None
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)
    ready: asyncio.Task[None] | None = field(default=None, repr=False)  # see SandboxHandle


def _exit_of(vm: Vm, launcher_returncode: int, cgroup: Cgroup) -> VmmExit:
    """How a VMM ended: its status from its launcher's (unknown for an adopted one, not our
    child) and whether its cgroup's OOM killer ended it (then by SIGKILL)."""
    oom = cgroup.oom_kills() > 0
    if isinstance(vm, QemuVm) and vm.adopted:
        return VmmExit(signal="SIGKILL" if oom else None, oom_killed=oom)
    code = jail.vmm_returncode(launcher_returncode, _log_tail(vm))
    if code < 0:
        try:
            return VmmExit(signal=signal.Signals(-code).name, oom_killed=oom)
        except ValueError:
            return VmmExit(signal=str(-code), oom_killed=oom)
    return VmmExit(exit_code=code, oom_killed=oom)


class Runtime:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.driver = QemuDriver(
            binary=cfg.qemu_binary, accel=cfg.accel, probe_kernel=cfg.kernel_path,
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
        # Pooled VMs (pools.py): empty incoming QEMUs for any restore of the default shape,
        # and default-template VMs primed for a create.
        self._pool: VmPool[tuple[object, ...]] = VmPool(
            "warm_pool", cfg.warm_pool_size, self._spawn_incoming, self._destroy, self._watch)
        self._primed: VmPool[str] = VmPool(
            "primed_pool", cfg.primed_pool_size, self.prime, self._destroy, self._watch,
            refill_delay_s=PRIMED_REFILL_DELAY_S)
        # ... and VMs primed from the snapshot created from last (a task's start state that
        # a GRPO group creates or forks from again and again).
        self._primed_snap: VmPool[str] = VmPool(
            "primed_snapshot", cfg.primed_snapshot_pool_size, self.prime, self._destroy,
            self._watch, refill_delay_s=PRIMED_REFILL_DELAY_S)
        self.on_vmm_exit: VmmExitHandler | None = None  # the orchestrator's
        self.hot = hot.HotTier(cfg, self._stop)
        self._tasks: set[asyncio.Task[None]] = set()  # see _background

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
        self.snapshots.gc_staging()
        try:
            tpl = self.catalog.get(self.cfg.default_template)
            self._pool.configure(self._pool_key(self.snapshots.get(tpl.snapshot_id)))
            self._primed.configure(tpl.snapshot_id)
        except (TemplateMissing, SnapshotNotFound, SnapshotCorrupt):
            pass  # no default template yet (before `aenv setup`): no pool
        self.hot.start()
        log.info("runtime ready: driver=%s accel=%s", self.driver.name, self.driver.accel())

    async def close(self) -> None:
        await self.hot.close()
        await self._primed.close()
        await self._primed_snap.close()
        await self._pool.close()
        await asyncio.gather(*(self._destroy(m) for m in list(self._machines.values())))
        self._machines.clear()
        await self.slots.close_async()

    async def settle_pool(self) -> None:
        """Wait for the pools' VMs in the making: the next restore of the default shape
        then takes a pooled QEMU, the next create of the default template a primed VM
        (reclaim; benchmarks that must not measure QEMU start-up)."""
        await self._pool.settle()
        await self._primed.settle()
        await self._primed_snap.settle()

    async def reclaim(self, keep: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
        """Reclaim what an earlier node process left behind, in the fixed order of
        `reclaim.STEPS` (processes, cgroups, network, mounts, files): everything of this
        instance but the VMs this process runs (adopted ones included), its warm pool and
        slots, and the directories of the sandboxes named in `keep`."""
        # The pool starts filling in start(): let its spawns finish so they count as live.
        t0 = time.perf_counter()
        await self.settle_pool()
        hot_vms = [h.machine for n in self.hot.names() if (h := self.hot.get(n))]
        live = ({m.jail for m in [*self._machines.values(), *hot_vms]} | self._pool.names()
                | self._primed.names() | self._primed_snap.names())
        done = await asyncio.to_thread(
            reclaim_mod.reclaim, self.cfg, self.snapshots, live_vms=live,
            keep_dirs=set(keep) | set(self._machines) | self.hot.names() | live,
            keep_slots=self.slots.owned(),
            pool_wait_ms=(time.perf_counter() - t0) * 1000)
        return done.items

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

    def cgroup(self, name: str) -> Cgroup:
        m = self._machines.get(name)
        return Cgroup(self.driver.jail_prefix + (m.jail if m else name))

    def accel(self) -> str:
        return self.driver.accel().value

    # -- templates --------------------------------------------------------------------
    def templates(self, *, usage: bool = False) -> list[TemplateInfo]:
        """With `usage`, each template's bytes, own and shared (FIEMAP: for listings)."""
        out = []
        for t in self.catalog.list():
            info = self._template_info(t.name)
            if usage:
                use = tree_usage(self.snapshots.path(t.snapshot_id)) + tree_usage(
                    self.catalog.dir(t.name))
                info = dataclasses.replace(info, size_bytes=use.total, shared_bytes=use.shared)
            out.append(info)
        return out

    def template(self, name_or_id: str) -> TemplateInfo:
        return self._template_info(name_or_id)

    def _template_info(self, name: str) -> TemplateInfo:
        base, _, tag = name.partition(":")  # "name:tag": a tag its last build carries
        try:
            t = self.catalog.get(base)
        except TemplateMissing:
            raise TemplateNotFound(f"template {name!r} not found") from None
        if tag and tag not in t.tags and tag != "default":
            raise TemplateNotFound(f"template {base!r} has no tag {tag!r}")
        return TemplateInfo(
            template_id=t.name, aliases=[t.name, *t.aliases], shape=t.shape,
            envd_version=t.envd_version, build_id=t.snapshot_id, created_at=t.created_at,
            size_bytes=t.rootfs_bytes, env=dict(t.env), user=t.user, workdir=t.workdir,
            source=t.source_image or f"recipe:{t.recipe}",
        )

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

    async def restore(self, name: str, snapshot_id: str | None) -> Machine:
        """Start a VM from a snapshot's files, or, with snapshot_id None, from the state a
        pause left in the VM's own directory. A pre-spawned QEMU from the warm pool is used
        when one matches: the files are cloned into the ones it already has open."""
        man = self.paused_manifest(name) if snapshot_id is None else self._manifest(snapshot_id)
        src_dir = self.cfg.sandboxes_dir / name if snapshot_id is None else self.snapshots.path(
            snapshot_id)
        try:
            check_restorable(src_dir, man)
        except SnapshotUnusable as e:
            raise UnusableSnapshot(f"cannot restore: {e}") from e
        warm = self._pool.take(self._pool_key(man))
        if warm is not None:
            return await self._restore_warm(name, man, src_dir, warm, paused=snapshot_id is None)
        slot, workdir = await self._prepare(name, fresh=snapshot_id is not None)
        spec = self._spec(slot, workdir, man.shape, Path(man.kernel), Path(man.tools),
                          man.cmdline)
        t0 = time.perf_counter()
        try:
            for f in ("memory", "disk"):
                if snapshot_id is not None:
                    clone(src_dir / f, workdir / f)
                self._own(workdir / f, slot.tap_uid)
            t1 = time.perf_counter()
            vm = await self.driver.spawn(spec, incoming=True)
        except BaseException:
            await self._release(slot, workdir if snapshot_id is not None else None)
            raise
        m = Machine(name, vm, slot, workdir, man.template, jail=name)
        self._register(m)
        try:
            t2 = time.perf_counter()
            fault("create.before_restore" if snapshot_id is not None else "resume.before_restore")
            await vm.restore(src_dir / "state")
            if snapshot_id is None:
                # From `cont` on the guest changes these very files: the paused state stops
                # being valid, so it must stop being found (a crash must not resume it).
                await asyncio.to_thread(self._forget_paused, workdir)
            await vm.resume()
            t3 = time.perf_counter()
        except BaseException:
            if snapshot_id is None:
                await self._stop(m)  # keep the paused files: the sandbox stays resumable
            else:
                await self.destroy(name)
            raise
        log.debug("restore %s: clone=%.1fms spawn=%.1fms load+cont=%.1fms", name,
                  (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)
        return m

    async def _restore_warm(self, name: str, man: Manifest, src_dir: Path, warm: Machine,
                            *, paused: bool) -> Machine:
        t0 = time.perf_counter()
        final = self.cfg.sandboxes_dir / name
        try:
            for f in ("memory", "disk"):
                # FICLONE into the file the pooled QEMU has open (and mapped): its owner and
                # mode stay the jail's.
                await asyncio.to_thread(clone, src_dir / f, warm.workdir / f)
            t1 = time.perf_counter()
            fault("resume.before_restore" if paused else "create.before_restore")
            await warm.vm.restore(src_dir / "state")
            await warm.vm.resume()
        except BaseException:
            await self._destroy(warm)
            raise
        t2 = time.perf_counter()
        # The sandbox's directory is now the pooled one, reached through a symlink named
        # after the sandbox: QEMU reopens its drives by path (block (in)activation around
        # migrations), so the real directory must keep its name. A paused sandbox's old
        # files go.
        await asyncio.to_thread(remove_tree, final)
        final.symlink_to(warm.workdir.name)
        m = Machine(name, warm.vm, warm.slot, final, man.template, jail=warm.jail,
                    http=warm.http)
        self._register(m)
        log.debug("restore %s (warm): clone=%.1fms load+cont=%.1fms", name,
                  (t1 - t0) * 1e3, (t2 - t1) * 1e3)
        return m

    def _manifest_of(self, m: Machine, snapshot_id: str, parent: str | None = None,
                     names: list[str] | None = None) -> Manifest:
        spec = m.vm.spec
        return Manifest(
            snapshot_id=snapshot_id, shape=spec.shape, kernel=str(spec.kernel),
            tools=str(spec.drives[0].path), cmdline=spec.cmdline, template=m.template_id,
            parent=parent, names=names or [],
        )

    async def _save(self, m: Machine, state: Path) -> tuple[float, float, float]:
        """Stop vCPUs and make device state, RAM and disk durable in the VM's files.
        Returns how long each of the three took (s): bench/fast.py's limit for a pause."""
        t0 = time.perf_counter()
        await m.vm.pause()
        fault("save.after_stop")
        t1 = time.perf_counter()
        await m.vm.save(state)
        t2 = time.perf_counter()
        await asyncio.gather(*(asyncio.to_thread(fsync_path, m.workdir / f)
                               for f in ("memory", "disk", state.name)))
        return t1 - t0, t2 - t1, time.perf_counter() - t2

    async def snapshot(self, name: str, manifest: Manifest, *, resume: bool = True,
                       checksums: bool = True) -> None:
        """Clone a running machine into the snapshot repository. The VM is stopped only
        while its device state is saved and its files are cloned. Chunk checksums (not for
        a transient snapshot) are computed later, in the background. A filesystem-only
        manifest (`memory` false) takes the disk alone, after the guest flushed it."""
        m = self._machines[name]
        await self._settled(m)
        state = m.workdir / "state"
        if not manifest.memory:
            await self._flush_guest(m, strict=False)
        try:
            if manifest.memory:
                await self._save(m, state)
            else:
                await m.vm.pause()  # stop vCPUs: nothing more reaches the disk
                await asyncio.to_thread(fsync_path, m.workdir / "disk")
            await asyncio.to_thread(
                self.snapshots.put, manifest,
                {"state": state, "memory": m.workdir / "memory", "disk": m.workdir / "disk"},
                checksums=checksums,
            )
            fault("snapshot.after_put")
        finally:
            if resume:
                await m.vm.resume()

    # -- pause / resume / fork ---------------------------------------------------------
    async def pause(self, name: str, *, memory: bool = True,
                    require_healthy_guest: bool = False) -> None:
        """Save the VM into its own directory and end the VMM: a paused sandbox holds no
        CPU, no RAM (its files' pages become clean cache) and no slot. Filesystem-only
        (`memory=False`): the guest flushes its filesystems first and only the disk is kept
        (no RAM file, no device state); resuming it is a reboot."""
        m = self._machines[name]
        await self._settled(m)
        if require_healthy_guest:
            # Fail fast on a wedged agent (the SDK retries a 503), before a long flush wait.
            await guest_flush.check_agent(m.http, m.slot.url(AGENT_PORT), GUEST_CHECK_TIMEOUT)
        if not memory:
            await self._flush_guest(m, strict=require_healthy_guest)
        took = (0.0, 0.0, 0.0)
        try:
            if memory:
                took = await self._save(m, m.workdir / "state")
            else:
                await m.vm.pause()  # stop vCPUs: nothing more reaches the disk
            fault("pause.after_save")
            t0 = time.perf_counter()
            man = self._manifest_of(m, name)
            man.created_at = now_rfc3339()
            await asyncio.to_thread(self._mark_paused, m.workdir, man, memory)
            fault("pause.after_manifest")
            log.debug("pause %s: stop=%.1fms save=%.1fms fsync=%.1fms mark=%.1fms", name,
                      *(x * 1e3 for x in took), (time.perf_counter() - t0) * 1e3)
        except BaseException:
            # Keep it running if it can; no paused state may stay behind a running guest.
            try:
                await asyncio.to_thread(self._forget_paused, m.workdir)
                await m.vm.resume()
            except BaseException:
                log.exception("pause of %s failed and its VM cannot continue", name)
                await self.destroy(name)
            raise
        if memory and self.hot.enabled:
            await self._keep_hot(m)
            return
        await self._stop(m)
        if not memory:
            await asyncio.to_thread(self._keep_disk_only, m.workdir)

    async def _keep_hot(self, m: Machine) -> None:
        """The paused state is durable: keep the stopped VMM and its slot (hot tier). It is
        no longer the sandbox's running VM, so its adoption record goes: a node restart
        reclaims it and the sandbox resumes cold."""
        self._machines.pop(m.name, None)
        with contextlib.suppress(OSError):
            await asyncio.to_thread(adoption.remove, m.workdir)
        await self.hot.keep(m)

    def tier(self, name: str) -> str | None:
        """A paused sandbox's tier, "hot" or "cold"; None when it is not paused."""
        if name in self.hot:
            return "hot"
        return "cold" if self.is_paused(name) else None

    async def _flush_guest(self, m: Machine, *, strict: bool) -> None:
        """`sync` in the guest before a filesystem-only pause. A guest that does not answer
        fails a strict pause (nothing changed); otherwise its disk is kept as it is, like
        after a power cut (ext4's journal keeps it mountable; unflushed writes are lost)."""
        try:
            await guest_flush.sync_filesystems(m.http, m.slot.url(AGENT_PORT), m.access_token,
                                               GUEST_FLUSH_TIMEOUT)  # fmt: skip
        except GuestUnresponsive as e:
            if strict:
                raise
            log.warning("filesystem-only pause of %s: the guest did not flush its "
                        "filesystems (%s); its disk is kept as it is", m.name, e)  # fmt: skip

    @staticmethod
    def _mark_paused(workdir: Path, man: Manifest, memory: bool) -> None:
        if memory:  # a resume checks it (check_restorable): ~100 KB, well under 1 ms
            man.state_sha256 = sha256_file(workdir / "state")
        write_json_atomic(workdir / PAUSE_MARKER, {"memory": memory})
        # The manifest last: its presence is what makes the directory a paused sandbox.
        write_json_atomic(workdir / "manifest.json", man.to_json())

    @staticmethod
    def _keep_disk_only(workdir: Path) -> None:
        """Make a paused VM directory filesystem-only: the disk durable, the RAM file and
        device state gone. The marker goes first: once a reboot has changed the disk, its
        old memory state must never be restored over it."""
        fsync_path(workdir / "disk")
        write_json_atomic(workdir / PAUSE_MARKER, {"memory": False})
        for f in ("memory", "state"):
            (workdir / f).unlink(missing_ok=True)
        fsync_path(workdir)

    @staticmethod
    def _forget_paused(workdir: Path) -> None:
        (workdir / "manifest.json").unlink(missing_ok=True)
        (workdir / PAUSE_MARKER).unlink(missing_ok=True)
        fsync_path(workdir)

    def paused_with_memory(self, name: str) -> bool:
        """The paused state in the VM's directory holds RAM and device state (a full pause);
        False after a filesystem-only pause (resume reboots)."""
        try:
            data = json.loads((self.cfg.sandboxes_dir / name / PAUSE_MARKER).read_text())
        except FileNotFoundError:
            return True  # paused before the marker existed: always a full pause
        except ValueError:
            return False  # unreadable: the disk alone is always resumable
        return isinstance(data, dict) and data.get("memory") is not False

    def paused_manifest(self, name: str) -> Manifest:
        try:
            data = json.loads((self.cfg.sandboxes_dir / name / "manifest.json").read_text())
            return Manifest.from_json(data)
        except (FileNotFoundError, ValueError, TypeError, KeyError, SnapshotCorrupt) as e:
            raise PausedStateMissing(f"sandbox {name} has no usable paused state: {e}") from e

    def is_paused(self, name: str) -> bool:
        return name not in self._machines and (
            self.cfg.sandboxes_dir / name / "manifest.json").is_file()

    def is_running(self, name: str) -> bool:
        """A VMM runs the sandbox (one that exited on its own is not running any more)."""
        m = self._machines.get(name)
        return m is not None and m.exited is None

    async def resume(self, name: str, init: AgentInit, *, memory: bool = True
                     ) -> SandboxHandle:
        if memory and name in self.hot:
            return await self._resume_hot(name, init)
        await self.hot.demote(name, "reboot")  # a reboot needs its files, not its VMM
        if not memory or not self.paused_with_memory(name):
            return await self._reboot(name, init)
        await self.make_room(self.paused_manifest(name).shape.memory_mib)
        m = await self.restore(name, None)
        RESUMES.labels("cold").inc()
        fault("resume.before_init")
        try:
            await self.push_init(m, init)
        except BaseException:
            # The guest has run since the restore: save it again so it stays resumable.
            try:
                await self.pause(name)
            except BaseException:
                log.exception("re-pause of %s after a failed resume failed", name)
                if name in self._machines:
                    await self.destroy(name)
            raise
        return self.handle(name, m.template_id)

    async def _resume_hot(self, name: str, init: AgentInit) -> SandboxHandle:
        """Continue the kept VMM. The paused state goes before the guest runs (as a restore
        does); the clock push and the adoption record follow in the background, and the
        data plane holds the sandbox's requests until they are done (`handle.ready`)."""
        h = self.hot.take(name)
        assert h is not None
        m = h.machine
        t0 = time.perf_counter()
        try:
            fault("resume.before_restore")
            await asyncio.to_thread(self._forget_paused, m.workdir)
            # The released RAM is read back beside the continue: the guest's first touches
            # wait only for pages still in flight.
            self._background(asyncio.to_thread(self._page_in, h))
            await m.vm.resume()
            fault("resume.before_init")
        except BaseException:
            await self._stop(m)
            raise
        self._machines[name] = m  # its watcher reports to _sandbox_vmm_exited already
        RESUMES.labels("hot").inc()
        handle = self.handle(name, m.template_id)
        m.ready = handle.ready = asyncio.get_running_loop().create_task(
            self._after_hot_resume(m, init))
        log.debug("resume %s (hot, released=%s): %.1fms", name, h.released,
                  (time.perf_counter() - t0) * 1e3)
        return handle

    @staticmethod
    def _page_in(h: hot.HotVm) -> None:
        try:
            hot.page_in(h)
        except OSError as e:  # only a prefetch: the guest faults its pages in anyway
            log.info("prefetch for %s failed: %s", h.machine.name, e)

    async def _after_hot_resume(self, m: Machine, init: AgentInit) -> None:
        """The guest's clock is behind by the pause: set it (the agent's /init with only a
        timestamp keeps identity and token), then record the VM for adoption. A resume that
        brings another token (not the orchestrator's: it keeps the sandbox's) gets the
        whole /init."""
        t0 = time.perf_counter()
        try:
            if init.access_token != m.access_token:
                await self.push_init(m, init)
                return
            await self._push_clock(m)
            if time.perf_counter() - t0 > CLOCK_RESYNC_S:
                await self._push_clock(m)
            t1 = time.perf_counter()
            await asyncio.to_thread(adoption.write, m.workdir, self._adoption_record(m))
            log.debug("after hot resume %s: clock=%.1fms record=%.1fms", m.name,
                      (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3)
        except (GuestReplyError, OSError, ProcessLookupError, BootError) as e:
            log.warning("after the hot resume of %s: %s", m.name, e)

    @staticmethod
    async def _push_clock(m: Machine) -> None:
        """Set the guest's clock (the agent's /init with only a timestamp keeps identity and
        token). The guest sets the time it is sent, so the answer's delay is its error."""
        try:
            r = await agent_replies.request(
                m.http, "POST", m.slot.url(AGENT_PORT) + "/init",
                json={"timestamp": now_rfc3339()}, deadline_s=AGENT_INIT_TIMEOUT)
        except GuestReplyError as e:
            log.warning("clock push to %s failed: %s", m.name, e)
            return
        if r.status >= 300:
            log.warning("clock push to %s answered %s", m.name, r.status)

    def _committed_mib(self) -> int:
        return sum(m.vm.spec.shape.memory_mib for m in self._machines.values())

    async def make_room(self, new_mib: int) -> None:
        """Demote hot VMMs, oldest first, while the node's memory budget lacks `new_mib`."""
        await self.hot.make_room(self._committed_mib(), new_mib)

    async def _reboot(self, name: str, init: AgentInit) -> SandboxHandle:
        """Resume by reboot: cold-boot the paused sandbox's own disk with the kernel, tools
        drive, command line and shape it ran with, then push init (same id, token, env).
        Processes are gone, files are kept; a memory state, if any, is discarded first. On
        failure the sandbox stays paused, filesystem-only: a disk is always rebootable."""
        man = self.paused_manifest(name)
        await asyncio.to_thread(self._keep_disk_only, self.cfg.sandboxes_dir / name)
        slot, workdir = await self._prepare(name, fresh=False)
        t0 = time.perf_counter()
        try:
            m = await self._boot_disk(name, man.template, slot, workdir, man.shape,
                                      Path(man.kernel), Path(man.tools), man.cmdline,
                                      keep_dir=True)  # fmt: skip
            try:
                await self.push_init(m, init)
            except BaseException:
                await self._stop(m)
                raise
        except BaseException:
            # Paused as before: the disk alone (the boot's RAM file goes).
            await asyncio.to_thread(self._keep_disk_only, workdir)
            raise
        await asyncio.to_thread(self._forget_paused, workdir)
        log.debug("reboot %s: boot+init=%.1fms", name, (time.perf_counter() - t0) * 1e3)
        return self.handle(name, m.template_id)

    async def _spawn_incoming(self, key: tuple[object, ...]) -> Machine:
        """One `-incoming defer` QEMU for a machine key with its slot and sparse, empty RAM
        and disk files (the warm pool's VMs)."""
        shape, kernel, tools, cmdline = key
        assert isinstance(shape, MachineShape)
        name = f"{POOL_PREFIX}{secrets.token_hex(4)}"
        slot, workdir = await self._prepare(name)
        spec = self._spec(slot, workdir, shape, Path(str(kernel)), Path(str(tools)),
                          str(cmdline))
        try:
            for f, size in (("memory", shape.memory_mib), ("disk", shape.disk_mib)):
                with open(workdir / f, "wb") as fh:
                    fh.truncate(size << 20)
                self._own(workdir / f, slot.tap_uid)
            vm = await self.driver.spawn(spec, incoming=True)
        except BaseException:
            await self._release(slot, workdir)
            raise
        return Machine(name, vm, slot, workdir, "", jail=name)

    async def prime(self, snapshot_id: str) -> Machine:
        """A VM restored from `snapshot_id`, run until its agent has answered `/health` and
        an identity-less `/init` (clock and entropy only), then stopped: the primed pool's.
        Under TCG the first requests after a restore pay for translating the guest code
        they run (`bench/snapshots.py --first-request`); a primed VM has paid already. It
        has run nothing but the template's agent; the sandbox's own `/init` reseeds it."""
        man = self._manifest(snapshot_id)
        src = self.snapshots.path(snapshot_id)
        check_restorable(src, man)
        m = await self._spawn_incoming(self._pool_key(man))
        try:
            for f in ("memory", "disk"):
                await asyncio.to_thread(clone, src / f, m.workdir / f)
            await m.vm.restore(src / "state")
            await m.vm.resume()
            url = m.slot.url(AGENT_PORT)
            warm_init = {"timestamp": now_rfc3339(),
                         "aenvEntropy": base64.b64encode(secrets.token_bytes(64)).decode()}
            for method, path, body in (("GET", "/health", None), ("POST", "/init", warm_init)):
                r = await agent_replies.request(m.http, method, url + path, json=body,
                                                deadline_s=AGENT_BOOT_TIMEOUT)
                if r.status >= 300:
                    raise BootError(f"agent {path} answered {r.status}: {r.snippet()}")
            await m.vm.pause()
        except BaseException:
            await self._destroy(m)
            raise
        m.template_id = man.template
        return m

    async def _continue_primed(self, name: str, primed: Machine) -> Machine:
        """Make a primed VM sandbox `name`: its directory is reached through a symlink
        named after the sandbox (as a warm restore's is), and its vCPUs continue."""
        final = self.cfg.sandboxes_dir / name
        try:
            await asyncio.to_thread(remove_tree, final)
            final.symlink_to(primed.workdir.name)
        except BaseException:
            await self._destroy(primed)
            raise
        m = Machine(name, primed.vm, primed.slot, final, primed.template_id, jail=primed.jail,
                    http=primed.http)
        self._register(m)
        fault("create.before_restore")
        await m.vm.resume()
        log.debug("create %s: primed VM %s continued", name, primed.name)
        return m

    async def _boot_snapshot(self, name: str, snapshot_id: str) -> Machine:
        """A new VM from a filesystem-only snapshot: a clone of its disk, cold-booted with
        the kernel, tools drive, command line and shape it was taken with."""
        man = self._manifest(snapshot_id)
        src = self.snapshots.path(snapshot_id)
        try:
            check_restorable(src, man)
        except SnapshotUnusable as e:
            raise UnusableSnapshot(f"cannot boot: {e}") from e
        slot, workdir = await self._prepare(name)
        try:
            await asyncio.to_thread(clone, src / "disk", workdir / "disk")
        except BaseException:
            await self._release(slot, workdir)
            raise
        return await self._boot_disk(name, man.template, slot, workdir, man.shape,
                                     Path(man.kernel), Path(man.tools), man.cmdline,
                                     keep_dir=False)  # fmt: skip

    async def fork(self, name: str, children: list[tuple[str, AgentInit]]
                   ) -> list[SandboxHandle | BaseException]:
        """Snapshot `name` and restore one child per entry, each with its own identity,
        token, env and entropy. A running sandbox keeps running; a paused one (hot or cold)
        is forked from its paused state on disk and stays paused."""
        snap_id = f"{FORK_PREFIX}{name}-{secrets.token_hex(4)}"
        m = self._machines.get(name)
        if m is not None:
            await self.snapshot(name, self._manifest_of(m, snap_id, parent=name),
                                checksums=False)  # fmt: skip
        else:
            await asyncio.to_thread(self._snapshot_paused, name, snap_id)
        fault("fork.after_snapshot")
        try:
            return await self.create_children(snap_id, children)
        finally:
            # Children hold reflinked copies: the fork snapshot itself is not kept.
            with contextlib.suppress(SnapshotNotFound):
                await asyncio.to_thread(self.snapshots.delete, snap_id)

    async def create_children(self, snapshot_id: str, children: list[tuple[str, AgentInit]]
                              ) -> list[SandboxHandle | BaseException]:
        """One VM per entry from a snapshot (a fork's, or a named one), each with its own
        identity: one result per child, its handle or why it failed."""
        await self.make_room(len(children) * self._manifest(snapshot_id).shape.memory_mib)
        # All children restore at once (a restore is mostly I/O and QMP); their /init, which
        # under TCG pays for translating the agent's code, runs behind the call, at most
        # max_concurrent_boots at a time: a crowd only competes for the same CPUs and misses
        # the /init deadline. The data plane holds a child's requests until its /init is done.
        gate = asyncio.Semaphore(max(1, self.cfg.max_concurrent_boots))

        async def child(cid: str, init: AgentInit) -> SandboxHandle:
            handle = await self._create_from(cid, snapshot_id, init, init_gate=gate)
            fault("fork.after_child")
            return handle

        return list(await asyncio.gather(*(child(cid, init) for cid, init in children),
                                         return_exceptions=True))  # fmt: skip

    def _snapshot_paused(self, name: str, snapshot_id: str) -> None:
        """A snapshot of a paused sandbox's state on disk (reflink clones; its stopped VMM,
        if hot, is untouched: the pause made its files whole)."""
        workdir = self.cfg.sandboxes_dir / name
        man = self.paused_manifest(name)
        man.memory = self.paused_with_memory(name)
        try:
            check_restorable(workdir, man)
        except SnapshotUnusable as e:
            raise UnusableSnapshot(f"cannot fork: {e}") from e
        man.snapshot_id, man.parent, man.names, man.created_at = snapshot_id, name, [], ""
        self.snapshots.put(man, {f: workdir / f for f in man.files}, checksums=False)

    async def snapshot_sandbox(self, name: str, snapshot_id: str, names: list[str], *,
                               memory: bool = True) -> SnapshotInfo:
        m = self._machines[name]
        man = self._manifest_of(m, snapshot_id, parent=name, names=names)
        man.memory = memory
        await self.snapshot(name, man)
        return _snapshot_info(man)

    def remove_template(self, name: str) -> None:
        """Out of the catalog at once (renamed to a dot name, then removed); its snapshot is
        the caller's to delete."""
        trash = self.cfg.templates_dir / f".rm-{name}-{secrets.token_hex(3)}"
        os.replace(self.catalog.dir(name), trash)
        remove_tree(trash)

    async def snapshot_build(self, name: str, snapshot_id: str, template: str) -> None:
        """A template build's snapshot of its VM (a step cache entry, or the template): like a
        template's own, it has no parent sandbox, so snapshot listings never show it."""
        m = self._machines[name]
        man = self._manifest_of(m, snapshot_id)
        man.template = template
        await self.snapshot(name, man)

    def has_snapshot(self, snapshot_id: str) -> bool:
        try:
            self.snapshots.get(snapshot_id)
        except (SnapshotNotFound, SnapshotCorrupt):
            return False
        return True

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        """A sandbox's snapshot (not a template's own, nor a fork's transient one)."""
        try:
            if snapshot_id.startswith(FORK_PREFIX):
                raise SnapshotNotFound(snapshot_id)
            man = self.snapshots.get(snapshot_id)
            if man.parent is None:
                raise SnapshotNotFound(snapshot_id)
        except (SnapshotNotFound, SnapshotCorrupt):
            raise TemplateNotFound(f"snapshot {snapshot_id!r} not found") from None
        return _snapshot_info(man)

    def list_snapshots(self) -> list[SnapshotInfo]:
        out = []
        for sid in self.snapshots.list():
            with contextlib.suppress(TemplateNotFound):
                out.append(self.snapshot_info(sid))
        return out

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Hide (rename) then remove. VMs restored from it keep their reflinked files."""
        try:
            self.snapshots.delete(snapshot_id)
        except SnapshotNotFound:
            raise TemplateNotFound(f"snapshot {snapshot_id!r} not found") from None

    async def wait_agent(self, m: Machine, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        url = m.slot.url(AGENT_PORT) + "/health"
        last: Exception | None = None
        while time.monotonic() < deadline:
            if m.name not in self._machines:
                raise BootError(f"{m.name} was destroyed while booting")
            if m.exited is not None:
                raise BootError(f"the VMM of {m.name} exited ({m.exited}): {_log_tail(m.vm)}")
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

    async def push_init(self, m: Machine, init: AgentInit) -> None:
        """Identity, env and fresh entropy for the guest; one attempt, no retry: a restored
        guest must answer its first request (fixed MACs make any slot look the same).
        First the sandbox's egress policy goes onto its slot (every start comes here)."""
        try:
            await asyncio.to_thread(set_egress, m.slot, init.egress, self.cfg.slot_network)
        except (OSError, RulesError) as e:
            raise BootError(f"applying the egress policy failed: {e}") from e
        body: dict[str, object] = {
            "envVars": init.env_vars,
            "defaultUser": init.default_user,
            "timestamp": now_rfc3339(),
            "aenvEntropy": base64.b64encode(secrets.token_bytes(64)).decode(),
        }
        if init.access_token:
            body["accessToken"] = init.access_token
        if init.default_workdir:
            body["defaultWorkdir"] = init.default_workdir
        t0 = time.monotonic()
        try:
            # The whole budget for connecting too: a guest restored next to many others
            # (fork x16 under TCG) may take seconds to be scheduled and accept.
            r = await agent_replies.request(m.http, "POST", m.slot.url(AGENT_PORT) + "/init",
                                            json=body, deadline_s=AGENT_INIT_TIMEOUT)
        except GuestReplyError as e:
            raise BootError(f"agent /init failed: {e}") from e
        if r.status >= 300:
            raise BootError(f"agent /init answered {r.status}: {r.snippet()}")
        if time.monotonic() - t0 > CLOCK_RESYNC_S:
            await self._push_clock(m)  # the guest set a time that was old by then
        m.access_token = init.access_token
        # From here on a client may hold this VM: a node restart re-adopts it.
        try:
            rec = self._adoption_record(m)
        except ProcessLookupError as e:
            raise BootError(f"the VMM ended: {e}") from e
        await asyncio.to_thread(adoption.write, m.workdir, rec)

    async def destroy(self, name: str) -> None:
        """End the VM (if any) and delete everything of it, paused state included."""
        h = self.hot.forget(name)
        m = self._machines.pop(name, None) or (h.machine if h else None)
        if m is not None:
            await self._destroy(m)
        else:
            await asyncio.to_thread(remove_tree, self.cfg.sandboxes_dir / name)

    async def _stop(self, m: Machine) -> None:
        """End the VMM and give back its slot, keeping its directory (pause)."""
        m.stopping = True  # before anything ends it: its watcher must not report the exit
        self._machines.pop(m.name, None)
        await m.http.aclose()
        with contextlib.suppress(OSError):  # it names a VMM that is about to end
            await asyncio.to_thread(adoption.remove, m.workdir)
        with contextlib.suppress(Exception):
            await m.vm.kill()
        await self.slots.release_async(m.slot)

    async def _destroy(self, m: Machine) -> None:
        await self._stop(m)
        await asyncio.to_thread(remove_tree, m.workdir)

    async def _release(self, slot: Slot, workdir: Path | None) -> None:
        if workdir is not None:
            await asyncio.to_thread(remove_tree, workdir)
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
            m.exited = _exit_of(m.vm, returncode, Cgroup(self.driver.jail_prefix + m.jail))
            log_event(log, "vmm.exited", logging.WARNING, vm=m.name,
                      exit_code=m.exited.exit_code, signal=m.exited.signal,
                      oom_killed=m.exited.oom_killed or None,
                      qemu_log=_log_tail(m.vm) or None)  # fmt: skip
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
                     shape: MachineShape | None = None) -> SandboxHandle:
        """From a template name or a snapshot id."""
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
        await self.make_room(template_shape.memory_mib)
        await self._create_from(sandbox_id, snapshot_id, init)
        return self.handle(sandbox_id, template)

    async def _create_from(self, sandbox_id: str, snapshot_id: str, init: AgentInit, *,
                           init_gate: asyncio.Semaphore | None = None) -> SandboxHandle:
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
        return handle

    async def _init_later(self, m: Machine, init: AgentInit, gate: asyncio.Semaphore) -> None:
        """A child's /init behind the call. If it fails the VM is ended and reported as a
        dead VMM, so the orchestrator removes the sandbox; the data plane answers 502."""
        try:
            async with gate:
                await self.push_init(m, init)
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
        transient one, nor a filesystem-only one): the pool follows the newest."""
        if snapshot_id.startswith(FORK_PREFIX) or snapshot_id == self._primed.key:
            return
        with contextlib.suppress(SnapshotNotFound, SnapshotCorrupt):
            man = self.snapshots.get(snapshot_id)
            if man.parent is not None and man.memory:
                self._primed_snap.retarget(snapshot_id)

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
        m = self._machines.get(handle.sandbox_id)
        if m is None:
            raise RuntimeError_(f"sandbox {handle.sandbox_id} is not running")
        headers = {"X-Access-Token": m.access_token} if m.access_token else {}
        r = await agent_replies.request(m.http, "GET", handle.url() + "/metrics",
                                        headers=headers, deadline_s=AGENT_METRICS_TIMEOUT)
        if r.status != 200:
            raise GuestReplyError(f"agent /metrics answered {r.status}: {r.snippet()}")
        return r.json_object()  # range-checked by the caller (AgentMetrics)

    def machines(self) -> dict[str, Machine]:
        return dict(self._machines)


def _log_tail(vm: Vm) -> str:
    return vm.log_tail() if isinstance(vm, QemuVm) else ""


def _snapshot_info(man: Manifest) -> SnapshotInfo:
    return SnapshotInfo(
        snapshot_id=man.snapshot_id, names=list(man.names), parent=man.parent,
        template=man.template, created_at=man.created_at, shape=man.shape,
    )

