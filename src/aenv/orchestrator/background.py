"""The orchestrator's background loops: the TTL sweeper and the metrics sampler."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from aenv.orchestrator.obs import log_event
from aenv.orchestrator.states import SandboxState

if TYPE_CHECKING:
    from aenv.orchestrator.service import Orchestrator

log = logging.getLogger("aenv.orchestrator")

# One agent /metrics call may take this long before the sample is skipped.
SAMPLE_TIMEOUT_S = 2.0
# Samples older than this are dropped.
METRICS_RETENTION_S = 3600


async def ttl_sweeper(orch: Orchestrator) -> None:
    """Every `ttl_sweep_interval_s`, kill each Running sandbox whose endAt has passed."""
    interval = orch.config.ttl_sweep_interval_s
    while True:
        await asyncio.sleep(interval)
        try:
            for sid in orch.store.expired(SandboxState.RUNNING, orch.now_us()):
                if sid in orch._expiring:
                    continue
                orch._expiring.add(sid)
                task = asyncio.create_task(_expire(orch, sid), name=f"aenv-expire-{sid}")
                task.add_done_callback(lambda _t, sid=sid: orch._expiring.discard(sid))
        except Exception:
            log.exception("ttl.sweep_failed")


async def _expire(orch: Orchestrator, sandbox_id: str) -> None:
    try:
        await orch.expire(sandbox_id)
    except Exception:
        log.exception("ttl.expire_failed", extra={"kv": {"sandbox_id": sandbox_id}})


async def metrics_sampler(orch: Orchestrator) -> None:
    """Every `metrics_interval_s`, sample each running sandbox's agent /metrics."""
    interval = orch.config.metrics_interval_s
    while True:
        await asyncio.sleep(interval)
        try:
            ids = [r.sandbox_id for r in orch.routes]
            if ids:
                await asyncio.gather(*(orch.sample(sid) for sid in ids))
            orch.store.prune_metrics(orch.now_us() - METRICS_RETENTION_S * 1_000_000)
        except Exception:
            log.exception("metrics.sample_failed")
        else:
            log_event(log, "metrics.sampled", logging.DEBUG, sandboxes=len(ids))
