"""A Runtime that starts no VMs: for API tests and `AENV_RUNTIME=fake`.

Handles point at `slot_addr` (default 127.0.0.1), so a test can stand up its own HTTP server
there and reach it through the data-plane proxy with `E2b-Sandbox-Port: <its port>`.
"""

from __future__ import annotations

import asyncio
import os
import time

from aenv.config import MachineShape
from aenv.orchestrator.runtime_api import (
    AgentInit,
    RuntimeError_,
    SandboxHandle,
    TemplateInfo,
    TemplateNotFound,
)


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
        self.inits: dict[str, AgentInit] = {}
        self.killed: list[str] = []
        self.fail_next_create: Exception | None = None
        self.started = False
        self.closed = False

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.killed.extend(self.live)
        self.live.clear()
        self.closed = True

    def templates(self) -> list[TemplateInfo]:
        return list(self._templates)

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
    ) -> SandboxHandle:
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
        if self.live.pop(handle.sandbox_id, None) is not None:
            self.killed.append(handle.sandbox_id)

    async def agent_metrics(self, handle: SandboxHandle) -> dict[str, object]:
        if handle.sandbox_id not in self.live:
            raise RuntimeError_("sandbox is gone")
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
