"""What the orchestrator needs from the node runtime (VMs + slots + disks).

`aenv.machines.runtime.Runtime` implements this against real QEMU VMs. The API and
state machine depend only on this protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from aenv.config import MachineShape
from aenv.network.egress import EgressPolicy
from aenv.teams.model import DEFAULT_TEAM

AGENT_PORT = 49983


@dataclass(frozen=True)
class TemplateInfo:
    template_id: str  # e.g. "base"
    aliases: list[str]
    shape: MachineShape
    envd_version: str
    build_id: str
    created_at: str  # RFC 3339
    size_bytes: int = 0  # data bytes of its files (snapshot, rootfs), in listings
    shared_bytes: int = 0  # of which shared with other files (templates, sandboxes, caches)
    # Sandbox defaults from the template's image config (Env, User, WorkingDir).
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    workdir: str | None = None
    source: str = ""  # what it was made from: a recipe, an image@digest, template:NAME
    fetched: bool = False  # a copy of another node's (Template.fetched)
    start_cmd: str | None = None  # running in its snapshot (its output: the guest's journal)


@dataclass(frozen=True)
class VolumeMount:
    name: str  # the volume's name (its export on the slot's server)
    path: str  # where the guest mounts it
    host_dir: Path  # its data on the node


@dataclass
class AgentInit:
    """What the node pushes to the agent's POST /init on create, resume and fork, and what
    else a start sets up for the sandbox around its guest."""

    access_token: str | None = None
    env_vars: dict[str, str] = field(default_factory=dict)
    default_user: str = "user"
    default_workdir: str | None = None
    # Not sent to the agent: applied to the slot before /init (default: no egress at all).
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    # Served from the slot (volumes/server.py) before /init, which mounts what is not yet.
    volumes: list[VolumeMount] = field(default_factory=list)


@dataclass
class SandboxHandle:
    sandbox_id: str
    template_id: str
    shape: MachineShape
    slot_addr: str  # host-reachable address of the slot; the agent is at slot_addr:AGENT_PORT
    vmm_pid: int
    # Done once the guest may take client requests (a hot resume sets its clock after the
    # call returns); None: ready now. The data plane waits for it.
    ready: asyncio.Future[None] | None = field(default=None, compare=False, repr=False)
    # While not ready: moves its start ahead of those nobody asked for (a fork child's /init).
    hurry: Callable[[], None] | None = field(default=None, compare=False, repr=False)

    def url(self, port: int = AGENT_PORT) -> str:
        return f"http://{self.slot_addr}:{port}"


@dataclass(frozen=True)
class VmmExit:
    """How a sandbox's VMM ended on its own (not ended by the node): its exit code, or the
    signal that ended it; neither when that is not ours to know (a VMM re-adopted after a
    node restart is not the node's child)."""

    exit_code: int | None = None
    signal: str | None = None
    oom_killed: bool = False  # its cgroup's OOM killer ended it (it hit its memory limit)

    def __str__(self) -> str:
        if self.signal is not None:
            return f"signal {self.signal}" + (" (OOM kill)" if self.oom_killed else "")
        return "status unknown" if self.exit_code is None else f"exit code {self.exit_code}"


# Told by the runtime when a sandbox's VMM exited on its own (a crash, an OOM kill, a kill
# by hand, a guest poweroff or reboot): the orchestrator then removes the sandbox.
VmmExitHandler = Callable[[str, VmmExit], None]


@dataclass(frozen=True)
class SnapshotInfo:
    """A named snapshot of a sandbox (`POST /sandboxes/{id}/snapshots`), usable as a template."""

    snapshot_id: str
    names: list[str]
    parent: str | None  # the sandbox it was taken from
    template: str  # the template that sandbox was created from
    created_at: str  # RFC 3339
    shape: MachineShape
    # A copy fetched from another node or the snapshot store (a cache entry: not listed);
    # then what creates from it take from its template, which this node may lack.
    fetched: bool = False
    origin: dict[str, object] = field(default_factory=dict)
    team_id: str = DEFAULT_TEAM  # the team of the sandbox it was taken from


class RuntimeError_(Exception):
    """Base for runtime failures the API maps to HTTP errors."""

    status = 500


class TemplateNotFound(RuntimeError_):
    status = 404


class TagNotFound(TemplateNotFound):
    """The template is there; no build of it carries that tag (or build id). E2B's words,
    which Harbor reads as "that build is not ready yet"."""

    def __init__(self, template: str, tag: str) -> None:
        super().__init__(f"tag '{tag}' does not exist for template '{template}'")
        self.template, self.tag = template, tag


class CapacityExceeded(RuntimeError_):
    status = 429


class GuestUnresponsive(RuntimeError_):
    """The guest agent did not answer (a pause with `requireHealthyGuest`); nothing changed,
    the sandbox keeps running. 503: the E2B SDK raises ServiceBusyException (retryable)."""

    status = 503


class Runtime(Protocol):
    # Set by the orchestrator before start(); called from the event loop, must not block.
    on_vmm_exit: VmmExitHandler | None
    # A secret's current value by name (the orchestrator's SecretStore.value): the egress
    # proxy fills `network.rules` placeholders with it. Raises for an unknown one.
    secret_value: Callable[[str, str], Awaitable[str]] | None  # (team, name) -> value

    async def start(self) -> None: ...

    async def close(self) -> None:
        """Kill every VM this runtime started and release slots (node shutdown)."""

    def templates(self, *, usage: bool = False) -> list[TemplateInfo]: ...

    def template(self, name_or_id: str) -> TemplateInfo:
        """Raise TemplateNotFound."""

    async def create(
        self,
        sandbox_id: str,
        template: str,
        init: AgentInit,
        shape: MachineShape | None = None,
        *,
        init_later: bool = False,
    ) -> SandboxHandle:
        """Restore the template's snapshot into a fresh VM, push init, return when the agent
        answers (`init_later`: once the VM runs, the handle's `ready` done when it has
        answered; if it never does the VM ends as a dead VMM). Leaves nothing behind on
        failure."""

    async def kill(self, handle: SandboxHandle) -> None:
        """End the VM and release its slot, disk and files (idempotent)."""

    async def agent_metrics(self, handle: SandboxHandle) -> dict[str, object]: ...

    async def agent_logs(self, handle: SandboxHandle, after: int) -> dict[str, object]:
        """The agent's journal after entry `after` (`GET /aenv/logs`), unchecked."""

    # -- pause, resume, snapshots, fork ----------------------------------------------------

    async def pause(
        self, sandbox_id: str, *, memory: bool = True, require_healthy_guest: bool = False
    ) -> None:
        """Make the running VM's state durable in its own files and end the VMM (no CPU, RAM
        or slot held). `memory=False`: filesystem-only, the guest flushes its filesystems and
        only the disk is kept. `require_healthy_guest`: GuestUnresponsive (VM untouched) if
        the agent does not answer; without it a filesystem-only pause goes on unflushed. On
        failure the VM keeps running if it can (`is_running`)."""

    async def resume(
        self, sandbox_id: str, init: AgentInit, *, memory: bool = True
    ) -> SandboxHandle:
        """Bring a paused sandbox back and push init: restore its memory state, or, with
        `memory=False` or after a filesystem-only pause, reboot its disk (processes are
        gone, files kept; the memory state, if any, is discarded). On failure it stays
        paused (`is_paused`) unless its state was lost."""

    def is_paused(self, sandbox_id: str) -> bool:
        """Complete paused state is on disk and no VMM runs it (survives a node restart)."""

    def tier(self, sandbox_id: str) -> str | None:
        """A paused sandbox's tier: "hot" (its stopped VMM is kept) or "cold"; else None."""

    def is_running(self, sandbox_id: str) -> bool:
        """This runtime runs a VMM for the sandbox."""

    async def set_egress(self, sandbox_id: str, policy: EgressPolicy) -> bool:
        """Apply a live egress update to the slot the sandbox's VM holds (running or hot-
        paused): True. False if none holds one: its next start applies the record's."""

    async def snapshot_sandbox(
        self, sandbox_id: str, snapshot_id: str, names: list[str], *, memory: bool = True,
        team_id: str = DEFAULT_TEAM,
    ) -> SnapshotInfo:
        """Clone a running sandbox into a new snapshot; the sandbox keeps running.
        `memory=False`: filesystem-only (the disk alone); creates from it cold-boot."""

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        """One user snapshot; raise TemplateNotFound."""

    def list_snapshots(self) -> list[SnapshotInfo]:
        """Every user snapshot (not templates' own, not a fork's transient one)."""

    def snapshot_bytes(self, snapshot_id: str) -> int:
        """The data bytes of a snapshot's files (blocks shared with others included); 0 if
        it has none here. Walks its files: for listings, off the event loop."""

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove a snapshot at once (it leaves listings; VMs restored from it keep their
        reflinked files). Raise TemplateNotFound if there is none."""

    async def fork(
        self, sandbox_id: str, children: list[tuple[str, AgentInit]], *,
        elsewhere: Callable[[str], Awaitable[list[Any]]] | None = None,
    ) -> list[Any]:
        """Snapshot the sandbox (running: it keeps running; paused: from its paused state)
        and start one child per entry: one handle or error each. `elsewhere`, given the
        snapshot's id, starts more children on other nodes while it exists; its results
        follow."""

    async def create_children(self, snapshot_id: str, children: list[tuple[str, AgentInit]]
                              ) -> list[SandboxHandle | BaseException]:
        """One sandbox per entry from a stored snapshot, restored side by side."""
