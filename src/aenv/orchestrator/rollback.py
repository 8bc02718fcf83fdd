"""Rollback in place: a running sandbox's VM is replaced by one restored from a snapshot (an
RL checkpoint), under the same id, token, timeout and network policy. Open streams end as on
a pause; volume data stays (volumes live outside the sandbox)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from aenv.obs import OPS_TOTAL, log_event, stage
from aenv.orchestrator.errors import ShuttingDown, StateConflict
from aenv.orchestrator.requests import agent_init
from aenv.orchestrator.states import SandboxState
from aenv.orchestrator.store import SandboxRecord

if TYPE_CHECKING:
    from aenv.orchestrator.service import Orchestrator

log = logging.getLogger("aenv.orchestrator")
S = SandboxState


async def rollback(orch: Orchestrator, sandbox_id: str, snapshot_id: str) -> SandboxRecord:
    """Running -> RollingBack -> Running. If the restore fails the sandbox is lost (its old
    VM is gone): it is removed and the error raised."""
    async with orch._locks.hold(sandbox_id):
        rec = orch._running_for(sandbox_id, "a rollback")
        orch._refuse(new=False)
        info = orch.find_snapshot(snapshot_id, team_id=rec.team_id)  # 404 if it went
        if info.shape.memory_mib != rec.memory_mib or info.shape.vcpus != rec.vcpus:
            raise StateConflict(f"snapshot {snapshot_id} is of another shape than "
                                f"sandbox {sandbox_id}")  # fmt: skip
        if not orch.store.transition(sandbox_id, [S.RUNNING], S.ROLLING_BACK, orch.now_us()):
            raise StateConflict(f"sandbox {sandbox_id} changed state", actual=str(rec.state))
        t0 = time.perf_counter()
        route = orch.routes.remove(sandbox_id)  # its streams end, as on a pause
        orch._snap_refs.acquire(snapshot_id)  # a DELETE meanwhile waits for the clone
        try:
            async with stage("rollback", "runtime_kill", sandbox_id):
                await orch._runtime_kill(route.handle if route else orch._handle(rec))
            async with stage("rollback", "runtime_restore", sandbox_id):
                # Back once the VM runs: the agent's /init (clock, entropy) completes behind
                # the call, and the data plane waits for it (under TCG a new QEMU's first
                # answer is most of a rollback's time).
                handle = await orch.runtime.create(
                    sandbox_id, snapshot_id, agent_init(rec, orch.config.volumes_dir),
                    init_later=True)
        except BaseException as e:
            OPS_TOTAL.labels("rollback", "error").inc()
            orch.store.transition(sandbox_id, [S.ROLLING_BACK], S.KILLING, orch.now_us())
            await orch._runtime_kill(orch._handle(rec))
            orch.store.delete(sandbox_id, [S.KILLING])
            log_event(log, "sandbox.lost", logging.ERROR, sandbox_id=sandbox_id,
                      during="rollback", error=repr(e))  # fmt: skip
            raise
        finally:
            if orch._snap_refs.release(snapshot_id):
                orch._delete_snapshot_files(snapshot_id)
        ok = orch.store.transition(sandbox_id, [S.ROLLING_BACK], S.RUNNING, orch.now_us(),
                                   slot_addr=handle.slot_addr, vmm_pid=handle.vmm_pid)
        if not ok:
            await orch._runtime_kill(handle)
            raise ShuttingDown("the node is shutting down")
        orch.routes.add(handle, rec.access_token, rec.ingress, resumed=True)
    OPS_TOTAL.labels("rollback", "ok").inc()
    log_event(log, "sandbox.rolled_back", sandbox_id=sandbox_id, snapshot_id=snapshot_id,
              slot=handle.slot_addr, ms=round((time.perf_counter() - t0) * 1000, 1))
    return orch.get(sandbox_id)
