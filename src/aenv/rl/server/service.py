"""The RL plane of a node: leases, groups and evaluations over the orchestrator, and the
sweeper that reclaims what a lapsed lease held (a trainer that died)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from aenv.obs import log_event
from aenv.orchestrator import snapshots as snaps
from aenv.orchestrator.errors import NotFound
from aenv.orchestrator.service import Orchestrator
from aenv.orchestrator.states import SandboxState
from aenv.rl.server.checkpoints import Checkpoints
from aenv.rl.server.evaluate import Evaluator
from aenv.rl.server.groups import Groups
from aenv.rl.server.leases import TIMEOUT_MARGIN_S, Lease, Leases
from aenv.rl.server.run_code import RunCode, Tokens

log = logging.getLogger("aenv.rl")
S = SandboxState
SWEEP_S = 0.5


class RL:
    """Valid between `start()` and `close()`."""

    def __init__(self, orch: Orchestrator) -> None:
        self.orch = orch
        self.leases = Leases()
        self.groups = Groups(orch, self.leases)
        self.evaluator = Evaluator(self.groups)
        self.checkpoints = Checkpoints(orch, self.leases)
        self.tokens = Tokens(lambda: orch.secrets_key)
        self.run_code = RunCode(self.groups, self.leases, self.renew,
                                template=lambda: orch.config.default_template)
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # A node that stopped without ending its groups (a crash) forgot their leases:
        # nothing refers to their start states and checkpoints any more.
        for snap in self.orch.snapshot_list():
            if snaps.internal(snap):
                with contextlib.suppress(NotFound):
                    self.orch.delete_snapshot(snap.snapshot_id)
                    log_event(log, "rl.stale_start_deleted", snapshot_id=snap.snapshot_id)
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="aenv-rl-sweep")

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for lease in list(self.leases):
            self.leases.remove(lease.lease_id)
            await self.reclaim(lease, "node_stopping")
        self.checkpoints.close()

    # -- leases ----------------------------------------------------------------------------

    def renew(self, lease_id: str, team_id: str) -> Lease:
        """Push the lease's end `lease_s` on, and its sandboxes' timeouts past it."""
        lease = self.leases.renew(lease_id, team_id)
        now = self.orch.now_us()
        end = now + int((lease.lease_s + TIMEOUT_MARGIN_S) * 1_000_000)
        for sid in self.held(lease):
            self.orch.store.extend_end(sid, [S.RUNNING], end, now)
        return lease

    def held(self, lease: Lease) -> list[str]:
        """Every sandbox the lease holds: its groups' members and its own."""
        return [*lease.sandboxes,
                *(m.sandbox_id for g in self.groups.of_lease(lease) for m in g.members)]

    def adopt(self, lease_id: str, team_id: str, sandbox_id: str) -> Lease:
        """The lease holds a sandbox the caller made (killed when the lease lapses)."""
        lease = self.leases.get(lease_id, team_id)
        self.groups.sandbox_of(sandbox_id, team_id)
        lease.sandboxes.add(sandbox_id)
        now = self.orch.now_us()
        end = now + int((lease.expires - time.monotonic() + TIMEOUT_MARGIN_S) * 1_000_000)
        self.orch.store.extend_end(sandbox_id, [S.RUNNING], end, now)
        return lease

    async def release(self, lease_id: str, team_id: str) -> None:
        lease = self.leases.get(lease_id, team_id)
        self.leases.remove(lease_id)
        await self.reclaim(lease, "released")

    async def reclaim(self, lease: Lease, reason: str) -> None:
        """End everything the lease held: its groups (members, start states) and sandboxes."""
        t0 = time.monotonic()
        groups = self.groups.of_lease(lease)
        for g in groups:
            await self.groups.end(g)
        await self.groups.kill_sandboxes(sorted(lease.sandboxes))
        log_event(log, "rl.lease_reclaimed", lease_id=lease.lease_id, reason=reason,
                  groups=len(groups), sandboxes=len(lease.sandboxes),
                  ms=round((time.monotonic() - t0) * 1000, 1))  # fmt: skip

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            for lease in self.leases.lapsed():
                try:
                    await self.reclaim(lease, "lapsed")
                except Exception:
                    log.exception("rl.reclaim_failed")
            try:
                self.checkpoints.collect()
            except Exception:
                log.exception("rl.collect_failed")
