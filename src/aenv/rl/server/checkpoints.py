"""Checkpoints, rollback in place, and trajectory trees.

A checkpoint is a snapshot of a running sandbox (named `rl-ckpt-...`, listed under `/rl`,
not in `GET /snapshots`). Each sandbox has a head: the checkpoint it last took, was rolled
back to, or was forked from; a new checkpoint's parent is that head. The parent links make
the tree `GET /rl/lineage/{id}` returns. A checkpoint is kept while something references it:
its sandbox, a lease, a live sandbox whose head it is, or a descendant that is kept. The rest
are collected (their snapshot deleted); deleting a checkpoint deletes its subtree."""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from dataclasses import dataclass

from aenv.obs import RL_OPS, log_event
from aenv.orchestrator import snapshots as snaps
from aenv.orchestrator.errors import InvalidRequest, NotFound
from aenv.orchestrator.requests import MAX_FORK_COUNT
from aenv.orchestrator.service import Orchestrator
from aenv.orchestrator.store import SandboxRecord
from aenv.rl.server.groups import member_state
from aenv.rl.server.leases import TIMEOUT_MARGIN_S, Lease, Leases

log = logging.getLogger("aenv.rl")
STEP_PREFIX = "step-"
CHECKPOINT_PREFIX = snaps.INTERNAL_PREFIX + "ckpt-"  # + the step id's rest: its snapshot's name


@dataclass
class Checkpoint:
    step_id: str
    snapshot_id: str
    sandbox_id: str  # taken of
    parent: str | None  # the step it descends from
    team_id: str
    lease: Lease | None
    created_at: float  # time.time()
    save_ms: float

    def to_json(self) -> dict[str, object]:
        return {"stepID": self.step_id, "sandboxID": self.sandbox_id, "parent": self.parent,
                "snapshotID": self.snapshot_id, "createdAt": self.created_at,
                "leaseID": self.lease.lease_id if self.lease else None,
                "saveMs": self.save_ms}


class Checkpoints:
    def __init__(self, orch: Orchestrator, leases: Leases) -> None:
        self.orch = orch
        self.leases = leases
        self._steps: dict[str, Checkpoint] = {}
        self._head: dict[str, str] = {}  # sandbox id -> the step it descends from

    def get(self, step_id: str, team_id: str) -> Checkpoint:
        c = self._steps.get(step_id)
        if c is None or c.team_id != team_id:
            raise NotFound(f"checkpoint \"{step_id}\" doesn't exist")
        return c

    def of_sandbox(self, sandbox_id: str) -> list[Checkpoint]:
        return sorted((c for c in self._steps.values() if c.sandbox_id == sandbox_id),
                      key=lambda c: c.created_at)  # fmt: skip

    def _lease(self, lease_id: str | None, team_id: str) -> Lease | None:
        return None if lease_id is None else self.leases.get(lease_id, team_id)

    async def take(self, team_id: str, sandbox_id: str, lease_id: str | None) -> Checkpoint:
        lease = self._lease(lease_id, team_id)
        step = STEP_PREFIX + secrets.token_hex(8)
        t0 = time.monotonic()
        try:
            info = await self.orch.snapshot(sandbox_id, CHECKPOINT_PREFIX + step[len(
                STEP_PREFIX):])  # fmt: skip
        except BaseException:
            RL_OPS.labels("checkpoint", "error").inc()
            raise
        c = Checkpoint(step, info.snapshot_id, sandbox_id, self._head.get(sandbox_id), team_id,
                       lease, time.time(), round((time.monotonic() - t0) * 1000, 1))
        self._steps[step] = c
        self._head[sandbox_id] = step
        RL_OPS.labels("checkpoint", "ok").inc()
        return c

    async def rollback(self, team_id: str, sandbox_id: str, step_id: str) -> dict[str, object]:
        c = self.get(step_id, team_id)
        t0 = time.monotonic()
        try:
            await self.orch.rollback(sandbox_id, c.snapshot_id)
        except BaseException:
            RL_OPS.labels("rollback", "error").inc()
            raise
        self._head[sandbox_id] = step_id
        RL_OPS.labels("rollback", "ok").inc()
        return {"sandboxID": sandbox_id, "stepID": step_id,
                "rollbackMs": round((time.monotonic() - t0) * 1000, 1)}

    async def fork(self, team_id: str, step_id: str, count: int, lease_id: str | None,
                   timeout_s: int | None) -> list[SandboxRecord | BaseException]:  # fmt: skip
        """`count` new sandboxes in the checkpoint's state, its children in the tree."""
        if isinstance(count, bool) or not 1 <= count <= MAX_FORK_COUNT:
            raise InvalidRequest(f"count must be between 1 and {MAX_FORK_COUNT}")
        c = self.get(step_id, team_id)
        lease = self._lease(lease_id, team_id)
        if timeout_s is None:
            timeout_s = int(lease.expires - time.monotonic() + TIMEOUT_MARGIN_S) if lease else 300
        kids = await self.orch.fork_snapshot(c.snapshot_id, count, timeout_s, team_id)
        for k in kids:
            if isinstance(k, SandboxRecord):
                self._head[k.sandbox_id] = step_id
                if lease is not None:
                    lease.sandboxes.add(k.sandbox_id)
        return kids

    # -- the tree --------------------------------------------------------------------------

    def _children(self) -> dict[str | None, list[Checkpoint]]:
        out: dict[str | None, list[Checkpoint]] = {}
        for c in self._steps.values():
            out.setdefault(c.parent, []).append(c)
        return out

    def _subtree(self, step_id: str) -> list[Checkpoint]:
        kids = self._children()
        out, todo = [], [step_id]
        while todo:
            s = todo.pop()
            if s in self._steps:
                out.append(self._steps[s])
            todo += [c.step_id for c in kids.get(s, [])]
        return out

    def lineage(self, team_id: str, some_id: str) -> dict[str, object]:
        """The tree holding a checkpoint or a sandbox: its checkpoints, and the live
        sandboxes whose head is in it."""
        step = some_id if some_id in self._steps else self._head.get(some_id)
        if step is None:
            raise NotFound(f"\"{some_id}\" is in no checkpoint tree")
        root = self.get(step, team_id)
        while root.parent is not None and root.parent in self._steps:
            root = self._steps[root.parent]
        steps = self._subtree(root.step_id)
        ids = {c.step_id for c in steps}
        nodes: list[dict[str, object]] = [{"id": c.step_id, "kind": "checkpoint"} | c.to_json()
                                          for c in steps]  # fmt: skip
        for sid, head in sorted(self._head.items()):
            state = member_state(self.orch.store.get(sid))
            if head in ids and state != "gone":
                nodes.append({"id": sid, "kind": "sandbox", "parent": head, "state": state})
        return {"root": root.step_id, "nodes": nodes}

    async def delete(self, team_id: str, step_id: str) -> dict[str, object]:
        """The checkpoint, every checkpoint below it, and the live sandboxes that descend
        from them (killed): what a pruned branch held."""
        self.get(step_id, team_id)
        steps = self._subtree(step_id)
        ids = {c.step_id for c in steps}
        doomed = [sid for sid, head in self._head.items() if head in ids]
        for sid in doomed:
            with contextlib.suppress(NotFound):
                await self.orch.kill(sid)
            self._head.pop(sid, None)
        for c in steps:
            self._drop(c)
        log_event(log, "rl.checkpoints_deleted", step_id=step_id, checkpoints=len(steps),
                  sandboxes=len(doomed))  # fmt: skip
        return {"checkpoints": sorted(ids), "sandboxes": sorted(doomed)}

    def _drop(self, c: Checkpoint) -> None:
        self._steps.pop(c.step_id, None)
        with contextlib.suppress(NotFound):
            self.orch.delete_snapshot(c.snapshot_id)

    def collect(self) -> int:
        """Delete the checkpoints nothing references (see the module's doc): how many."""
        for sid in [s for s in self._head if self.orch.store.get(s) is None]:
            del self._head[sid]  # a sandbox that is gone is no one's reference
        live_leases = {le.lease_id for le in self.leases}
        held = {c.step_id for c in self._steps.values()
                if (c.lease is not None and c.lease.lease_id in live_leases)
                or self.orch.store.get(c.sandbox_id) is not None}  # fmt: skip
        held |= set(self._head.values())
        keep: set[str] = set()
        for s in held:  # a kept checkpoint keeps its ancestors
            while s is not None and s in self._steps and s not in keep:
                keep.add(s)
                s = self._steps[s].parent  # type: ignore[assignment]
        gone = [c for c in self._steps.values() if c.step_id not in keep]
        for c in gone:
            self._drop(c)
        if gone:
            log_event(log, "rl.checkpoints_collected", count=len(gone))
        return len(gone)

    def close(self) -> None:
        for c in list(self._steps.values()):
            self._drop(c)
        self._head.clear()
