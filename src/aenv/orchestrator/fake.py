"""A Runtime that starts no VMs: for API tests and `AENV_RUNTIME=fake`.

Handles point at `slot_addr` (default 127.0.0.1), so a test can stand up its own HTTP server
there and reach it through the data-plane proxy with `E2b-Sandbox-Port: <its port>`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from aenv.config import MachineShape
from aenv.machines.api import (
    AgentInit,
    GuestUnresponsive,
    RuntimeError_,
    SandboxHandle,
    SnapshotInfo,
    TemplateInfo,
    TemplateNotFound,
    VmmExit,
    VmmExitHandler,
)
from aenv.network.egress import EgressPolicy
from aenv.teams.model import DEFAULT_TEAM


def default_templates() -> list[TemplateInfo]:
    return [
        TemplateInfo(
            template_id="base",
            aliases=["base"],
            shape=MachineShape(),
            envd_version="0.6.4",
            build_id="fake-build-base",
            created_at="2026-01-01T00:00:00Z",
        )
    ]


class FakeRuntime:
    def __init__(
        self,
        templates: list[TemplateInfo] | None = None,
        slot_addr: str = "127.0.0.1",
        boot_delay_s: float = 0.0,
    ) -> None:
        self._templates = templates if templates is not None else default_templates()
        self.slot_addr = slot_addr
        self.boot_delay_s = boot_delay_s
        self.live: dict[str, SandboxHandle] = {}
        self.paused: dict[str, SandboxHandle] = {}  # "files on disk": survives nothing here
        self.paused_memory: dict[str, bool] = {}  # False: a filesystem-only pause
        self.unresponsive: set[str] = set()  # sandboxes whose "guest agent" does not answer
        self.resumes: list[tuple[str, str]] = []  # (sandbox id, "restore" or "reboot")
        self.snapshots: dict[str, SnapshotInfo] = {}
        self.inits: dict[str, AgentInit] = {}
        self.egress: dict[str, EgressPolicy] = {}  # live updates, as applied to the "slot"
        self.killed: list[str] = []
        self.guest_logs: dict[str, list[dict[str, object]]] = {}  # the agents' journals
        self.fail_next_create: Exception | None = None
        self.fail_next_pause: Exception | None = None
        self.fail_next_resume: Exception | None = None
        self.exited: set[str] = set()  # live sandboxes whose "VMM" died (`vmm_exit`)
        self.on_vmm_exit: VmmExitHandler | None = None
        self.secret_value: Callable[[str, str], Awaitable[str]] | None = None
        self.started = False
        self.closed = False

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.killed.extend(self.live)
        self.live.clear()
        self.closed = True

    def templates(self, *, usage: bool = False) -> list[TemplateInfo]:
        return list(self._templates)

    def remove_template(self, name: str) -> None:
        self._templates = [t for t in self._templates if t.template_id != name]

    def template(self, name_or_id: str) -> TemplateInfo:
        for t in self._templates:
            if name_or_id == t.template_id or name_or_id in t.aliases:
                return t
        raise TemplateNotFound(f"template '{name_or_id}' not found")

    async def create(
        self,
        sandbox_id: str,
        template: str,
        init: AgentInit,
        shape: MachineShape | None = None,
        *,
        init_later: bool = False,
    ) -> SandboxHandle:
        if template in self.snapshots:
            snap = self.snapshots[template]
            info = TemplateInfo(template_id=template, aliases=snap.names, shape=snap.shape,
                                envd_version="0.6.4", build_id=template, created_at="")
        else:
            info = self.template(template)
        if self.boot_delay_s:
            await asyncio.sleep(self.boot_delay_s)
        if self.fail_next_create is not None:
            exc, self.fail_next_create = self.fail_next_create, None
            raise exc
        handle = SandboxHandle(
            sandbox_id=sandbox_id,
            template_id=info.template_id,
            shape=shape or info.shape,
            slot_addr=self.slot_addr,
            vmm_pid=os.getpid(),
        )
        self.live[sandbox_id] = handle
        self.inits[sandbox_id] = init
        return handle

    async def kill(self, handle: SandboxHandle) -> None:
        self.exited.discard(handle.sandbox_id)
        if (self.live.pop(handle.sandbox_id, None) or self.paused.pop(handle.sandbox_id, None)
                ) is not None:
            self.killed.append(handle.sandbox_id)

    def vmm_exit(self, sandbox_id: str, how: VmmExit | None = None) -> None:
        """What the QEMU runtime's watcher does when a VMM dies on its own: the VM stays
        listed until it is killed (its resources are released then), is no longer running,
        and the orchestrator is told."""
        assert sandbox_id in self.live, sandbox_id
        self.exited.add(sandbox_id)
        if self.on_vmm_exit is not None:
            self.on_vmm_exit(sandbox_id, how or VmmExit(signal="SIGKILL"))

    # -- pause, resume, snapshots, fork ------------------------------------------------------

    async def pause(
        self, sandbox_id: str, *, memory: bool = True, require_healthy_guest: bool = False
    ) -> None:
        if require_healthy_guest and sandbox_id in self.unresponsive:
            raise GuestUnresponsive(f"the guest agent of {sandbox_id} did not answer")
        if sandbox_id in self.exited:  # the real runtime's save fails: not running, not paused
            raise RuntimeError_(f"the VMM of {sandbox_id} exited")
        if self.boot_delay_s:
            await asyncio.sleep(self.boot_delay_s)
        if self.fail_next_pause is not None:
            exc, self.fail_next_pause = self.fail_next_pause, None
            raise exc
        self.paused[sandbox_id] = self.live.pop(sandbox_id)
        self.paused_memory[sandbox_id] = memory

    async def resume(
        self, sandbox_id: str, init: AgentInit, *, memory: bool = True
    ) -> SandboxHandle:
        if sandbox_id not in self.paused:
            raise RuntimeError_(f"sandbox {sandbox_id} has no paused state")
        reboot = not memory or not self.paused_memory.get(sandbox_id, True)
        if reboot:
            self.paused_memory[sandbox_id] = False  # a reboot discards the memory state first
        if self.boot_delay_s:
            await asyncio.sleep(self.boot_delay_s)
        if self.fail_next_resume is not None:
            exc, self.fail_next_resume = self.fail_next_resume, None
            raise exc
        handle = self.live[sandbox_id] = self.paused.pop(sandbox_id)
        self.paused_memory.pop(sandbox_id, None)
        self.inits[sandbox_id] = init
        self.resumes.append((sandbox_id, "reboot" if reboot else "restore"))
        return handle

    def is_paused(self, sandbox_id: str) -> bool:
        return sandbox_id in self.paused

    def tier(self, sandbox_id: str) -> str | None:
        return "cold" if sandbox_id in self.paused else None

    def is_running(self, sandbox_id: str) -> bool:
        return sandbox_id in self.live and sandbox_id not in self.exited

    async def set_egress(self, sandbox_id: str, policy: EgressPolicy) -> bool:
        if sandbox_id not in self.live:
            return False
        self.egress[sandbox_id] = policy
        return True

    async def snapshot_sandbox(
        self, sandbox_id: str, snapshot_id: str, names: list[str], *, memory: bool = True,
        team_id: str = DEFAULT_TEAM,
    ) -> SnapshotInfo:
        h = self.live[sandbox_id]
        info = SnapshotInfo(
            snapshot_id=snapshot_id, names=list(names), parent=sandbox_id,
            template=h.template_id, shape=h.shape, team_id=team_id,
            created_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        )  # fmt: skip
        self.snapshots[snapshot_id] = info
        return info

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        try:
            return self.snapshots[snapshot_id]
        except KeyError:
            raise TemplateNotFound(f"snapshot {snapshot_id!r} not found") from None

    def list_snapshots(self) -> list[SnapshotInfo]:
        return list(self.snapshots.values())

    def snapshot_bytes(self, snapshot_id: str) -> int:
        return 0

    def delete_snapshot(self, snapshot_id: str) -> None:
        if self.snapshots.pop(snapshot_id, None) is None:
            raise TemplateNotFound(f"snapshot {snapshot_id!r} not found")

    async def fork(
        self, sandbox_id: str, children: list[tuple[str, AgentInit]], *,
        elsewhere: Callable[[str], Awaitable[list[Any]]] | None = None,
    ) -> list[Any]:
        src = self.live.get(sandbox_id) or self.paused[sandbox_id]
        away = await elsewhere(f"fork-{sandbox_id}") if elsewhere is not None else []
        return [*self._children(src, children), *away]

    async def create_children(self, snapshot_id: str, children: list[tuple[str, AgentInit]]
                              ) -> list[SandboxHandle | BaseException]:
        snap = self.snapshots[snapshot_id]
        src = SandboxHandle(sandbox_id=snapshot_id, template_id=snap.template, shape=snap.shape,
                            slot_addr=self.slot_addr, vmm_pid=os.getpid())  # fmt: skip
        return self._children(src, children)

    def _children(self, src: SandboxHandle, children: list[tuple[str, AgentInit]]
                  ) -> list[SandboxHandle | BaseException]:
        out: list[SandboxHandle | BaseException] = []
        for cid, init in children:
            if self.fail_next_create is not None:
                exc, self.fail_next_create = self.fail_next_create, None
                out.append(exc)
                continue
            h = SandboxHandle(sandbox_id=cid, template_id=src.template_id, shape=src.shape,
                              slot_addr=self.slot_addr, vmm_pid=os.getpid())  # fmt: skip
            self.live[cid] = h
            self.inits[cid] = init
            out.append(h)
        return out

    async def agent_logs(self, handle: SandboxHandle, after: int) -> dict[str, object]:
        """What tests put in `guest_logs[sandbox_id]`: the journal's entries after `after`."""
        if handle.sandbox_id not in self.live:
            raise RuntimeError_("sandbox is gone")
        entries = [e for e in self.guest_logs.get(handle.sandbox_id, []) if e["seq"] > after]
        return {"entries": entries, "next": entries[-1]["seq"] if entries else after}

    async def agent_metrics(self, handle: SandboxHandle) -> dict[str, object]:
        if handle.sandbox_id not in self.live:
            raise RuntimeError_("sandbox is gone")
        if handle.sandbox_id in self.unresponsive:
            raise RuntimeError_("the guest agent does not answer")
        return {
            "ts": int(time.time()),
            "cpu_count": handle.shape.vcpus,
            "cpu_used_pct": 1.5,
            "mem_total": handle.shape.memory_mib << 20,
            "mem_used": 64 << 20,
            "mem_cache": 8 << 20,
            "disk_used": 100 << 20,
            "disk_total": handle.shape.disk_mib << 20,
        }
