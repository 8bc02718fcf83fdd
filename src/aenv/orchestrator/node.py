"""The orchestrator as its background tasks and restart recovery see it (`background.py`,
`recovery.py`): a Protocol, so those modules need not import `service` (which starts them)."""

from __future__ import annotations

from typing import Protocol

from aenv.config import Config
from aenv.machines.api import Runtime, SandboxHandle, VmmExit
from aenv.orchestrator.locks import Joiner, SandboxLocks
from aenv.orchestrator.memory_admission import MemoryAdmission
from aenv.orchestrator.reachability import Reachability
from aenv.orchestrator.routes import RouteTable
from aenv.orchestrator.store import SandboxRecord, Store


class Node(Protocol):
    config: Config
    store: Store
    runtime: Runtime
    routes: RouteTable
    memory: MemoryAdmission
    reachability: Reachability
    # Its bookkeeping that the background tasks share with it.
    _locks: SandboxLocks
    _joiner: Joiner
    _expiring: set[str]  # sandboxes whose TTL expiry is being handled
    _started: bool
    _closing: bool

    def now_us(self) -> int: ...

    async def expire(self, sandbox_id: str) -> None: ...

    async def remove_dead(self, sandbox_id: str, how: VmmExit) -> bool: ...

    async def sample(self, sandbox_id: str) -> bool: ...

    def _handle(self, rec: SandboxRecord) -> SandboxHandle: ...
