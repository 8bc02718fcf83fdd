"""QEMU driver: `-M microvm` over QMP, every process started through the jail.

RAM is a `memory-backend-file,share=on` in the VM's directory on the reflink data
filesystem and migration runs with `x-ignore-shared`, so save writes device state only
(~100 KB) and restore maps the RAM file: both cost milliseconds. A preloaded library
(`vmm/ram.py`) makes that mapping private, so VMs of one snapshot share its pages.
Device state moves over a file descriptor passed on the QMP socket (`getfd` + `fd:`), so
QEMU never needs to open or spawn anything for it (`-sandbox spawn=deny`).
The guest's serial console goes to a fixed-size ring inside QEMU (`-chardev ringbuf`), not
to a file: a guest flooding its console costs no host disk and no node CPU.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from qemu.qmp import QMPClient

from aenv.network.netns import run_in_netns
from aenv.network.tap import IFF_NO_PI, IFF_TAP, IFF_VNET_HDR, open_tap
from aenv.vmm import jail, ram
from aenv.vmm.base import Accel, Capabilities, Driver, Vm, VmmError, VmSpec
from aenv.vmm.cgroup import Limits
from aenv.vmm.jailroot import RootSpec

log = logging.getLogger(__name__)

SANDBOX_OPTS = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
QMP_TIMEOUT = 10.0
KVM_PROBE_DEADLINE = 5.0
# Run states a save (`stop` + migrate to a file) leaves a guest in, and the migration states
# during which it must not be continued yet (QEMU's RunState and MigrationStatus).
STOPPED_BY_SAVE = ("paused", "postmigrate")
MIGRATING = ("setup", "active", "device", "pre-switchover", "cancelling", "wait-unplug")
# The console ring's size (QEMU wants a power of two): the last 64 KiB of guest console
# output, kept in QEMU's memory (charged to the jail's cgroup) and read over QMP.
CONSOLE_RING_BYTES = 64 * 1024
CONSOLE_CHARDEV = "console"


def host_tsc_khz() -> int:
    """Guests under TCG must be told the TSC rate: microvm has no PIT/HPET to calibrate it
    and 2 of 15 boots hung without it (architecture.md §7)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            return int(float(line.split(":")[1]) * 1000)
    return 2_000_000


class QemuVm(Vm):
    def __init__(self, spec: VmSpec, jailed: jail.Jailed, qmp: QMPClient) -> None:
        self.spec = spec
        self._jailed = jailed
        self._qmp = qmp

    @property
    def pid(self) -> int:
        return self._jailed.vmm_pid() or self._jailed.proc.pid

    @property
    def launcher_pid(self) -> int:
        return self._jailed.proc.pid

    @property
    def adopted(self) -> bool:
        """Re-attached after a node restart: not our child, so its exit status is unknown."""
        return isinstance(self._jailed.proc, jail.AdoptedProcess)

    def identity(self) -> jail.JailIdentity:
        """What a later node process needs to find this VMM again (`QemuDriver.adopt`)."""
        return self._jailed.identity()

    async def _cmd(self, cmd: str, args: dict[str, object] | None = None) -> object:
        try:
            return await asyncio.wait_for(self._qmp.execute(cmd, args), QMP_TIMEOUT)
        except Exception as e:
            raise VmmError(f"QMP {cmd} failed: {e}") from e

    async def boot(self) -> None:
        await self._cmd("cont")

    async def pause(self) -> None:
        await self._cmd("stop")

    async def resume(self) -> None:
        await self._cmd("cont")

    async def _pass_fd(self, name: str, fd: int) -> None:
        self._qmp.send_fd_scm(fd)
        await self._cmd("getfd", {"fdname": name})

    async def _ignore_shared(self) -> None:
        await self._cmd(
            "migrate-set-capabilities",
            {"capabilities": [{"capability": "x-ignore-shared", "state": True}]},
        )

    async def save(self, state_file: Path) -> None:
        await self._ignore_shared()
        fd = os.open(state_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            await self._pass_fd("state", fd)
        finally:
            os.close(fd)
        await self._cmd("migrate", {"uri": "fd:state"})
        while True:
            info = await self._cmd("query-migrate")
            status = info.get("status") if isinstance(info, dict) else None
            if status == "completed":
                return
            if status in ("failed", "cancelled"):
                raise VmmError(f"saving device state failed: {info.get('error-desc', status)}")
            await asyncio.sleep(0.001)

    async def restore(self, state_file: Path) -> None:
        await self._ignore_shared()
        fd = os.open(state_file, os.O_RDONLY)
        try:
            await self._pass_fd("state", fd)
        finally:
            os.close(fd)
        await self._cmd("migrate-incoming", {"uri": "fd:state"})
        while True:
            if self._jailed.proc.returncode is not None:
                raise VmmError(f"QEMU exited during restore: {self.log_tail()}")
            st = await self._cmd("query-status")
            if isinstance(st, dict) and st.get("status") != "inmigrate":
                return
            await asyncio.sleep(0.001)

    async def kill(self) -> None:
        with contextlib.suppress(Exception):
            await self._qmp.disconnect()
        await self._jailed.kill()

    async def wait(self) -> int:
        return await self._jailed.proc.wait()

    async def console_tail(self, n: int = 1500) -> str:
        """The newest `n` bytes (at most) of the guest's console; reading drains the ring."""
        data = await self._cmd("ringbuf-read", {
            "device": CONSOLE_CHARDEV, "size": CONSOLE_RING_BYTES, "format": "base64"})
        raw = base64.b64decode(data) if isinstance(data, str) else b""
        return raw[-n:].decode(errors="replace")

    def log_tail(self, n: int = 800) -> str:
        try:
            return (self.spec.workdir / "qemu.log").read_text(errors="replace")[-n:].strip()
        except FileNotFoundError:
            return ""


class QemuDriver(Driver):
    name = "qemu"

    def __init__(self, binary: str = "qemu-system-x86_64", accel: str = "auto",
                 tcg_tb_mib: int = 64, probe_kernel: Path | None = None,
                 cache_dir: Path | None = None,
                 memory_overhead_mib: int = 384, pids_max: int = 256,
                 jail_prefix: str = "") -> None:
        self.binary = binary
        self.ram_shim: Path | None = None  # built by check() (needs cache_dir)
        self.requested_accel = accel
        self.tcg_tb_mib = tcg_tb_mib
        self.probe_kernel = probe_kernel
        self.cache_dir = cache_dir
        self.memory_overhead_mib = memory_overhead_mib
        self.pids_max = pids_max
        self.jail_prefix = jail_prefix
        self._accel: Accel | None = None

    def check(self) -> None:
        if shutil.which(self.binary) is None:
            raise VmmError(f"{self.binary} not found: install Debian package qemu-system-x86")
        for tool in ("unshare", "setpriv", "nsenter"):
            if shutil.which(tool) is None:
                raise VmmError(f"{tool} not found: install util-linux")
        if self.cache_dir is not None:
            self.ram_shim = ram.shim(self.cache_dir)
        self.accel()

    def capabilities(self) -> Capabilities:
        return Capabilities(accel=self.accel())

    def accel(self) -> Accel:
        if self._accel is None:
            self._accel = self._detect_accel()
        return self._accel

    def _detect_accel(self) -> Accel:
        if self.requested_accel == "tcg":
            return Accel.TCG
        if not os.path.exists("/dev/kvm"):
            if self.requested_accel == "kvm":
                raise VmmError("accel=kvm was forced but /dev/kvm does not exist")
            log.info("no /dev/kvm: using TCG (software emulation)")
            return Accel.TCG
        if self._kvm_boots():
            return Accel.KVM
        if self.requested_accel == "kvm":
            raise VmmError("accel=kvm was forced but a guest does not boot under KVM here")
        log.info("KVM is not usable for guests here: using TCG")
        return Accel.TCG

    def _kvm_boots(self) -> bool:
        """Boot the guest kernel under KVM with no root disk: a usable KVM reaches the
        kernel's 'VFS: Unable to mount root' panic well inside the deadline. The answer is
        cached per host kernel + guest kernel. The one QEMU outside a jail (it must open
        /dev/kvm before any slot exists): it runs our own kernel with no disk and no network,
        and still with no capabilities, no_new_privs and QEMU's seccomp filter."""
        if self.probe_kernel is None or not self.probe_kernel.exists():
            log.info("no guest kernel to run the KVM boot probe with yet")
            return False
        st = self.probe_kernel.stat()
        key = f"{os.uname().release}:{socket.gethostname()}:{st.st_size}:{st.st_mtime_ns}"
        cache = self.cache_dir / "kvm-probe.json" if self.cache_dir else None
        if cache and cache.exists():
            data = json.loads(cache.read_text())
            if data.get("key") == key:
                return bool(data["ok"])
        t0 = time.monotonic()
        ok = self.probe_boots(Accel.KVM, self.probe_kernel)
        log.info("KVM boot probe: %s in %.1fs", "ok" if ok else "failed", time.monotonic() - t0)
        if cache:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"key": key, "ok": ok}))
        return ok

    def probe_boots(self, accel: Accel, kernel: Path,
                    deadline_s: float = KVM_PROBE_DEADLINE) -> bool:
        """The boot probe: `kernel` reaches its no-root-disk panic under `accel` within
        `deadline_s` (KVM: well under a second; TCG: seconds, more on a busy host)."""
        return self.probe(accel, kernel, deadline_s)[0]

    def probe(self, accel: Accel, kernel: Path,
              deadline_s: float = KVM_PROBE_DEADLINE) -> tuple[bool, str]:
        """probe_boots, and what QEMU printed (the tail), for a failure to be read."""
        argv = ["setpriv", "--no-new-privs", "--bounding-set=-all", "--inh-caps=-all",
                "--ambient-caps=-all", "--",
                self.binary, "-M", f"microvm,accel={accel.value}",
                "-cpu", "host" if accel is Accel.KVM else "max", "-m", "128",
                "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
                "-sandbox", SANDBOX_OPTS, "-serial", "stdio", "-kernel", str(kernel),
                # The TSC frequency given, as for sandboxes: a busy host can make the kernel's
                # own calibration fail (no PIT or HPET on microvm) and the boot hang there.
                "-append", f"console=ttyS0 panic=-1 reboot=t tsc_early_khz={host_tsc_khz()} "
                "tsc=reliable"]  # fmt: skip
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else ""
            return False, f"no panic within {deadline_s:.0f} s: ...{out[-1500:]}"
        ok = "Unable to mount root" in r.stdout or "Kernel panic" in r.stdout
        return ok, f"exit {r.returncode}: ...{r.stdout[-1500:]} {r.stderr[-500:]}"

    def argv(self, spec: VmSpec, *, incoming: bool, tap_fd: int | None = None) -> list[str]:
        accel = self.accel()
        mem = spec.shape.memory_mib
        a = [
            self.binary,
            "-M", "microvm,memory-backend=ram",
            "-cpu", "host" if accel is Accel.KVM else "max",
            "-smp", str(spec.shape.vcpus),
            "-m", f"{mem}M",
            "-object",
            f"memory-backend-file,id=ram,size={mem}M,mem-path={spec.memory_file},share=on",
            "-nodefaults", "-no-user-config", "-display", "none",
            "-kernel", str(spec.kernel), "-append", spec.cmdline,
            "-chardev", f"ringbuf,id={CONSOLE_CHARDEV},size={CONSOLE_RING_BYTES}",
            "-serial", f"chardev:{CONSOLE_CHARDEV}",
            "-qmp", f"unix:{spec.workdir / 'qmp.sock'},server=on,wait=off",
            "-object", "rng-random,id=rng0,filename=/dev/urandom",
            "-device", "virtio-rng-device,rng=rng0",
            "-device", "virtio-balloon-device,free-page-reporting=on",
            "-sandbox", SANDBOX_OPTS,
            # A guest reboot (also a panic: the kernel has panic=-1) ends QEMU, as a guest
            # poweroff does: a rebooted guest would come back without its /init (token,
            # env), so the node removes the sandbox instead (docs/api.md).
            "-no-reboot",
            "-S",
        ]
        # The TCG translation cache is most of QEMU's own memory (config.tcg_tb_mib).
        a += ["-accel", f"tcg,tb-size={self.tcg_tb_mib}" if accel is Accel.TCG else "kvm"]
        for i, d in enumerate(spec.drives):
            opts = f"id=d{i},file={d.path},format=raw,if=none,werror=report,rerror=report"
            opts += ",readonly=on" if d.read_only else ",discard=unmap"
            a += ["-drive", opts, "-device", f"virtio-blk-device,drive=d{i}"]
        if spec.net is not None and tap_fd is not None:
            a += ["-netdev", f"tap,id=n0,fd={tap_fd},vhost=off",
                  "-device", f"virtio-net-device,netdev=n0,mac={spec.net.mac}"]
        if incoming:
            a += ["-incoming", "defer"]
        return a

    def jail_root(self, spec: VmSpec) -> RootSpec:
        """What QEMU opens by path: kernel and read-only drives (shared artifacts), its own
        directory (RAM, disk, QMP socket) and, under KVM, /dev/kvm."""
        rw = (spec.workdir, spec.memory_file, *(d.path for d in spec.drives if not d.read_only))
        return RootSpec(
            ro_paths=(spec.kernel, *(d.path for d in spec.drives if d.read_only)),
            rw_paths=rw,
            devices=(Path("/dev/kvm"),) if self.accel() is Accel.KVM else (),
            libs=(self.ram_shim,) if self.ram_shim else (),
        )

    async def spawn(self, spec: VmSpec, *, incoming: bool) -> Vm:
        mem_bytes = (spec.shape.memory_mib + self.memory_overhead_mib) << 20
        # The tap is opened here, as root inside the slot's namespace, and inherited by
        # QEMU: the jail needs neither /dev/net/tun nor the slot's namespace.
        tap_fd = None
        if spec.net is not None:
            tap_fd = await asyncio.to_thread(
                run_in_netns, spec.net.netns_path, open_tap, spec.net.tap,
                IFF_TAP | IFF_NO_PI | IFF_VNET_HDR)
        jspec = jail.JailSpec(
            name=self.jail_prefix + spec.workdir.name,
            uid=spec.uid,
            limits=Limits(memory_bytes=mem_bytes, pids=self.pids_max,
                          cpus=float(spec.shape.vcpus)),
            log_file=spec.workdir / "qemu.log",
            pass_fds=(tap_fd,) if tap_fd is not None else (),
            root=self.jail_root(spec),
            env=ram.shim_env(spec.memory_file, spec.workdir, self.ram_shim)
            if self.ram_shim else {},
        )
        qmp_path = spec.workdir / "qmp.sock"
        qmp_path.unlink(missing_ok=True)
        try:
            jailed = await jail.spawn(jspec, self.argv(spec, incoming=incoming, tap_fd=tap_fd))
        finally:
            if tap_fd is not None:
                os.close(tap_fd)
        try:
            qmp = await self._connect(jailed, qmp_path, spec)
        except BaseException:
            await jailed.kill()
            raise
        return QemuVm(spec, jailed, qmp)

    async def adopt(self, spec: VmSpec, jailed: jail.Jailed) -> QemuVm:
        """Re-attach to a VMM an earlier node process spawned (`jail.adopt` found it): its
        QMP socket must answer and its guest must run. A guest a save left stopped (the
        crash came during a pause, snapshot or fork) continues once that migration is over,
        as after a failed pause; any other run state (incoming, crashed, shut down) is a
        VmmError. Nothing is killed here."""
        qmp = await self._connect(jailed, spec.workdir / "qmp.sock", spec)
        vm = QemuVm(spec, jailed, qmp)
        try:
            deadline = time.monotonic() + QMP_TIMEOUT
            while True:
                st = await vm._cmd("query-status")
                status = st.get("status") if isinstance(st, dict) else None
                if status == "running":
                    return vm
                mig = await vm._cmd("query-migrate")
                migrating = isinstance(mig, dict) and mig.get("status") in MIGRATING
                if status in STOPPED_BY_SAVE and not migrating:
                    await vm.resume()
                    return vm
                if status not in (*STOPPED_BY_SAVE, "finish-migrate"):
                    raise VmmError(f"VM {spec.workdir.name} is {status}: not adoptable")
                if time.monotonic() > deadline:
                    raise VmmError(f"VM {spec.workdir.name} is still saving its state")
                await asyncio.sleep(0.01)
        except BaseException:
            with contextlib.suppress(Exception):
                await qmp.disconnect()
            raise

    async def _connect(self, jailed: jail.Jailed, path: Path, spec: VmSpec) -> QMPClient:
        deadline = time.monotonic() + QMP_TIMEOUT
        qmp = QMPClient(spec.workdir.name)
        while True:
            if jailed.proc.returncode is not None:
                tail = (spec.workdir / "qemu.log").read_text(errors="replace")[-800:].strip()
                raise VmmError(f"QEMU exited at start (status {jailed.proc.returncode}): {tail}")
            if path.exists():
                try:
                    await qmp.connect(str(path))
                    return qmp
                except Exception:
                    pass
            if time.monotonic() > deadline:
                raise VmmError("QEMU did not open its QMP socket in time")
            await asyncio.sleep(0.002)
