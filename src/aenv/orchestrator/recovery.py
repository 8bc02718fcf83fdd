"""Node restart: resolve every record left by the previous process (`states.RECOVERY`).

A record whose paused state the runtime finds complete on disk (`is_paused`) is Paused
whatever transition it was in (Pausing, Paused, Resuming). Every other record that needs a
VM (Running, Snapshotting, Forking, and Pausing/Paused/Resuming without complete paused
state) is offered to the Runtime's optional extension

    async def adopt(self, handles: list[SandboxHandle]) -> list[SandboxHandle]

which re-attaches to those VMs that still run and answer (the QEMU runtime: its adoption
record, process identity, slot, QMP `query-status` and agent `/health`; a guest a save left
stopped continues). The handles it returns become Running with their routes; the others are
removed. Without `adopt`, no VM survives a restart. Creating and Killing records are removed
(their clients got no id, or asked for the kill). Then, if the Runtime offers

    async def reclaim(self, keep: set[str]) -> list[str]

(the QEMU one: `reclaim.reclaim_runtime`, given to it by the factory) it is asked to end every
VM, jail, slot and directory an earlier node process left behind (old warm-pool VMs and hot
VMMs included) except those of the sandboxes that keep a record (adopted, or paused: their
state is on disk). The full table is in docs/architecture.md.
"""

from __future__ import annotations

import logging
import time

from aenv.machines.api import SandboxHandle
from aenv.obs import log_event
from aenv.orchestrator.node import Node
from aenv.orchestrator.requests import agent_init
from aenv.orchestrator.states import RECOVERY, SandboxState
from aenv.orchestrator.store import SandboxRecord

log = logging.getLogger("aenv.orchestrator")


async def recover(orch: Node) -> dict[str, int]:
    t0 = time.perf_counter()
    store = orch.store
    records = store.all()
    is_paused = getattr(orch.runtime, "is_paused", None)
    paused_ok = {
        r.sandbox_id for r in records
        if RECOVERY[r.state] == "paused" and (not callable(is_paused) or is_paused(r.sandbox_id))
    }  # fmt: skip

    def action_of(rec: SandboxRecord) -> str:
        action = RECOVERY[rec.state]
        if action == "paused" and rec.sandbox_id not in paused_ok:
            return "adopt"  # no complete paused state: a VM, if the runtime still runs it
        return action

    candidates = [r for r in records if action_of(r) == "adopt" and r.slot_addr]
    adopted: dict[str, SandboxHandle] = {}
    adopt = getattr(orch.runtime, "adopt", None)
    if candidates and callable(adopt):
        try:
            handles = await adopt([orch._handle(r) for r in candidates])
            adopted = {h.sandbox_id: h for h in handles}
        except Exception:
            log.exception("recovery.adopt_failed")
    counts = {"kept": 0, "adopted": 0, "removed": 0, "paused": 0}
    now = orch.now_us()
    for rec in records:
        action = action_of(rec)
        if action == "paused" and rec.state is SandboxState.PAUSED:
            counts["kept"] += 1
        elif action == "paused":
            store.force_state(rec.sandbox_id, SandboxState.PAUSED, now)
            counts["paused"] += 1
            log_event(log, "recovery.paused", sandbox_id=rec.sandbox_id, state=str(rec.state))
        elif action == "adopt" and rec.sandbox_id in adopted:
            store.force_state(rec.sandbox_id, SandboxState.RUNNING, now)
            orch.routes.add(adopted[rec.sandbox_id], rec.access_token, rec.ingress)
            serve = getattr(orch.runtime, "serve_volumes", None)
            if rec.volume_mounts and callable(serve):  # its server ended with the last node
                try:
                    await serve(rec.sandbox_id,
                                agent_init(rec, orch.config.volumes_dir).volumes)
                except Exception:
                    log.exception("recovery.volumes_failed")
            if rec.egress.domains or rec.egress.egress_proxy:  # the slot points at the last
                # process's egress proxy or tunnel listener
                try:
                    await orch.runtime.set_egress(rec.sandbox_id,
                                                  rec.egress.owned_by(rec.team_id))
                except Exception:
                    log.exception("recovery.egress_failed sandbox_id=%s", rec.sandbox_id)
            counts["adopted"] += 1
            log_event(log, "recovery.adopted", sandbox_id=rec.sandbox_id, state=str(rec.state))
        elif action in ("adopt", "remove"):
            store.force_delete(rec.sandbox_id)
            counts["removed"] += 1
            log_event(log, "recovery.removed", sandbox_id=rec.sandbox_id, state=str(rec.state))
        else:
            counts["kept"] += 1
    reclaim = getattr(orch.runtime, "reclaim", None)
    if callable(reclaim):
        try:
            # Keep every sandbox that still has a record: adopted VMs and paused state.
            keep = {r.sandbox_id for r in store.all()}
            t_reclaim = time.perf_counter()
            reclaimed = await reclaim(keep=keep)
        except Exception:
            log.exception("recovery.reclaim_failed")
        else:
            counts["reclaimed"] = len(reclaimed)
            # Its steps and their order: `aenv.orchestrator.reclaim` (logged as recovery.reclaim).
            counts["reclaim_ms"] = round((time.perf_counter() - t_reclaim) * 1000)
    if records or counts.get("reclaimed"):
        log_event(log, "recovery.done", ms=round((time.perf_counter() - t0) * 1000, 1), **counts)
    return counts
