"""The hypervisor driver interface: one small surface every VMM driver implements.

The orchestrator only talks to this. A driver knows how to start one VMM process (always
through the jail), boot it from a kernel or restore it from a snapshot, pause, save and
resume it, and end it. It knows nothing about HTTP, databases or templates.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from pathlib import Path

from aenv.config import MachineShape


class VmmError(Exception):
    """A VMM operation failed; the message is meant for an operator."""


class Accel(enum.StrEnum):
    KVM = "kvm"
    TCG = "tcg"


@dataclass(frozen=True)
class Capabilities:
    accel: Accel
    snapshot: bool = True
    # RAM lives in a shared file, so pause saves device state only.
    shared_memory_snapshots: bool = True
    balloon_free_page_reporting: bool = True


@dataclass(frozen=True)
class NetAttachment:
    """Where the guest NIC goes: a tap inside a network namespace, with a fixed MAC."""

    netns_path: Path
    tap: str
    mac: str


@dataclass(frozen=True)
class Drive:
    path: Path
    read_only: bool


@dataclass
class VmSpec:
    """Everything a VMM needs to start; it must match between a snapshot and its restore."""

    shape: MachineShape
    workdir: Path  # per-VM directory: sockets, logs, RAM and disk files (owned by the jail uid)
    kernel: Path
    cmdline: str
    drives: list[Drive]  # vda = tools (ro), vdb = rootfs (rw)
    net: NetAttachment | None
    uid: int  # jail uid/gid
    memory_file: Path = field(default=Path())

    def __post_init__(self) -> None:
        if self.memory_file == Path():
            self.memory_file = self.workdir / "memory"


class Vm(abc.ABC):
    """A handle on one running (or incoming) VMM process."""

    spec: VmSpec

    @property
    @abc.abstractmethod
    def pid(self) -> int: ...

    @abc.abstractmethod
    async def boot(self) -> None:
        """Start vCPUs of a cold-booted VM (spawned with boot=True)."""

    @abc.abstractmethod
    async def pause(self) -> None:
        """Stop vCPUs; the VM stays in memory."""

    @abc.abstractmethod
    async def save(self, state_file: Path) -> None:
        """Write device state to state_file (VM must be paused). RAM stays in memory_file."""

    @abc.abstractmethod
    async def restore(self, state_file: Path) -> None:
        """Load device state into a VM spawned with incoming=True (leaves it paused)."""

    @abc.abstractmethod
    async def resume(self) -> None:
        """Start vCPUs after pause or restore."""

    @abc.abstractmethod
    async def kill(self) -> None:
        """End the VMM process and release what the driver holds (idempotent)."""

    @abc.abstractmethod
    async def wait(self) -> int:
        """Wait for the VMM process to end; returns its exit status."""

    @abc.abstractmethod
    async def console_tail(self, n: int = 1500) -> str:
        """The newest output (at most `n` bytes) of the guest's serial console, for errors.
        Bounded by the driver: a guest flooding its console must not fill the host."""


class Driver(abc.ABC):
    name: str

    @abc.abstractmethod
    def check(self) -> None:
        """Raise VmmError with a clear message if this driver cannot run here."""

    @abc.abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abc.abstractmethod
    async def spawn(self, spec: VmSpec, *, incoming: bool) -> Vm:
        """Start a VMM process through the jail. incoming=True waits for a restore."""
