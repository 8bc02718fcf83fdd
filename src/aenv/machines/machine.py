"""One VM and what every part of the runtime shares about VMs: its record (`Machine`), the
runtime's errors, limits and the guest kernel's command line."""

from __future__ import annotations

import asyncio
import signal
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from aenv.machines.api import (
    RuntimeError_,
    SnapshotInfo,
    VmmExit,
)
from aenv.network.addressing import guest_ip_cmdline
from aenv.network.slot import Slot
from aenv.storage.snapshots import (
    Manifest,
)
from aenv.vmm import jail
from aenv.vmm.base import Vm
from aenv.vmm.cgroup import Cgroup
from aenv.vmm.qemu import QemuVm, host_tsc_khz

# A fork's snapshot is transient: it lives only while its children are restored.
FORK_PREFIX = "fork-"
AGENT_BOOT_TIMEOUT = 180.0  # a cold boot under TCG: kernel ~1 s, Python agent start far more
# A restored guest's first request: its QEMU translates the agent's code afresh under TCG,
# next to a burst of others (64 creates at once on 2 cores passed 10 s).
AGENT_INIT_TIMEOUT = 20.0
# A fork child's /init, behind the call (its requests wait for it, api/proxy.py): 64
# children restored beside 16 parents on 2 TCG cores passed 20 s; a broken guest is still
# found, later.
AGENT_INIT_BEHIND_TIMEOUT = 45.0
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


def _plain() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    return ctx


# The agent speaks plain HTTP on the slot's address. A client's default TLS context loads the
# host's CA bundle, ~50 ms on the event loop for each VM: 64 fork children held a node's
# loop for seconds (and its lease renewal with it). One context, shared, never used.
AGENT_TLS = _plain()


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
        timeout=httpx.Timeout(10.0, connect=1.0), verify=AGENT_TLS))
    # Set before the node itself ends the VMM (kill, pause, shutdown, a failed start): its
    # exit is then expected. A VMM that exits without it died on its own (`exited`).
    stopping: bool = False
    # Held while a live egress update writes the slot's rules; the slot goes back to the
    # pool only after it (`Runtime._stop`), so an update never opens the next tenant's slot.
    net_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    exited: VmmExit | None = None
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)
    ready: asyncio.Task[None] | None = field(default=None, repr=False)  # see SandboxHandle


def exit_of(vm: Vm, launcher_returncode: int, cgroup: Cgroup) -> VmmExit:
    """How a VMM ended: its status from its launcher's (unknown for an adopted one, not our
    child) and whether its cgroup's OOM killer ended it (then by SIGKILL)."""
    oom = cgroup.oom_kills() > 0
    if isinstance(vm, QemuVm) and vm.adopted:
        return VmmExit(signal="SIGKILL" if oom else None, oom_killed=oom)
    code = jail.vmm_returncode(launcher_returncode, log_tail(vm))
    if code < 0:
        try:
            return VmmExit(signal=signal.Signals(-code).name, oom_killed=oom)
        except ValueError:
            return VmmExit(signal=str(-code), oom_killed=oom)
    return VmmExit(exit_code=code, oom_killed=oom)



def log_tail(vm: Vm) -> str:
    return vm.log_tail() if isinstance(vm, QemuVm) else ""


def info_of_snapshot(man: Manifest) -> SnapshotInfo:
    return SnapshotInfo(
        snapshot_id=man.snapshot_id, names=list(man.names), parent=man.parent,
        template=man.template, created_at=man.created_at, shape=man.shape,
        fetched=man.fetched is not None,
        origin=dict(man.fetched.get("origin") or {}) if man.fetched else {},  # type: ignore[call-overload]
        team_id=man.team_id,
    )

