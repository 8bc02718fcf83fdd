"""What the orchestrator needs from the node runtime (VMs + slots + disks).

`aenv.orchestrator.runtime.Runtime` implements this against real QEMU VMs. The API and
state machine depend only on this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from aenv.config import MachineShape

AGENT_PORT = 49983


@dataclass(frozen=True)
class TemplateInfo:
    template_id: str  # e.g. "base"
    aliases: list[str]
    shape: MachineShape
    envd_version: str
    build_id: str
    created_at: str  # RFC 3339
    size_bytes: int = 0


@dataclass
class AgentInit:
    """What the node pushes to the agent's POST /init on create, resume and fork."""

    access_token: str | None = None
    env_vars: dict[str, str] = field(default_factory=dict)
    default_user: str = "user"
    default_workdir: str | None = None


@dataclass
class SandboxHandle:
    sandbox_id: str
    template_id: str
    shape: MachineShape
    slot_addr: str  # host-reachable address of the slot; the agent is at slot_addr:AGENT_PORT
    vmm_pid: int

    def url(self, port: int = AGENT_PORT) -> str:
        return f"http://{self.slot_addr}:{port}"


class RuntimeError_(Exception):
    """Base for runtime failures the API maps to HTTP errors."""

    status = 500


class TemplateNotFound(RuntimeError_):
    status = 404


class CapacityExceeded(RuntimeError_):
    status = 429


class Runtime(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None:
        """Kill every VM this runtime started and release slots (node shutdown)."""

    def templates(self) -> list[TemplateInfo]: ...

    def template(self, name_or_id: str) -> TemplateInfo:
        """Raise TemplateNotFound."""

    async def create(
        self,
        sandbox_id: str,
        template: str,
        init: AgentInit,
        shape: MachineShape | None = None,
    ) -> SandboxHandle:
        """Restore the template's snapshot into a fresh VM, push init, return when the agent
        answers. Leaves nothing behind on failure."""

    async def kill(self, handle: SandboxHandle) -> None:
        """End the VM and release its slot, disk and files (idempotent)."""

    async def agent_metrics(self, handle: SandboxHandle) -> dict[str, object]: ...
