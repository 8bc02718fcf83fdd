"""Sandbox metrics: one sandbox's samples over a window, and the latest of several at once.

Included before the sandbox routes: `/sandboxes/metrics` must not be read as a sandbox id."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from aenv.api import query
from aenv.api.apierror import ApiError
from aenv.api.auth import require_api_key, team_of
from aenv.api.models import Error, SandboxesWithMetrics, SandboxMetric
from aenv.orchestrator.errors import NotFound
from aenv.orchestrator.service import Orchestrator
from aenv.orchestrator.store import MetricSample

MAX_IDS = 100  # sandbox_ids of one batch

router = APIRouter(dependencies=[Depends(require_api_key)],
                   responses={s: {"model": Error} for s in (400, 401, 404, 500)})  # fmt: skip


def _orch(request: Request) -> Orchestrator:
    return request.app.state.orchestrator


def _metric(m: MetricSample) -> SandboxMetric:
    return SandboxMetric(
        timestamp=query.rfc3339(m.ts_us), timestampUnix=m.ts_us // 1_000_000,
        cpuCount=m.cpu_count, cpuUsedPct=m.cpu_used_pct, memUsed=m.mem_used,
        memTotal=m.mem_total, memCache=m.mem_cache, diskUsed=m.disk_used,
        diskTotal=m.disk_total,
    )  # fmt: skip


@router.get("/sandboxes/metrics", operation_id="getSandboxesMetrics")
async def sandboxes_metrics(
    request: Request, sandbox_ids: Annotated[str, Query(description="comma-separated")],
) -> SandboxesWithMetrics:
    """The latest sample of each sandbox named (a fresh one if the last is older than the
    sampling interval); ids that name no sandbox here are left out, as on E2B."""
    ids = list(dict.fromkeys(i.strip() for i in sandbox_ids.split(",") if i.strip()))
    if not ids or len(ids) > MAX_IDS:
        raise ApiError(400, f"sandbox_ids: between 1 and {MAX_IDS} comma-separated ids")
    orch = _orch(request)
    team = team_of(request)

    async def latest(sid: str) -> MetricSample | None:
        rec = orch.store.get(sid)
        if rec is not None and rec.team_id != team:
            return None  # another team's: left out like one that does not exist
        try:
            samples = await orch.metrics(sid, orch.now_us() - _window_us(orch), None)
        except NotFound:
            return None
        return samples[-1] if samples else None

    got = await asyncio.gather(*(latest(sid) for sid in ids))
    return SandboxesWithMetrics(
        sandboxes={sid: _metric(m) for sid, m in zip(ids, got, strict=True) if m is not None})


def _window_us(orch: Orchestrator) -> int:
    """How far back the latest sample may be: a few sampling intervals (a paused sandbox's
    last one may be older: then it has none)."""
    return int(orch.config.metrics_interval_s * 3 * 1_000_000)


@router.get("/sandboxes/{sandbox_id}/metrics", operation_id="getSandboxMetrics")
async def sandbox_metrics(
    request: Request,
    sandbox_id: str,
    start: Annotated[int | None, Query(ge=0, description="unix seconds")] = None,
    end: Annotated[int | None, Query(ge=0, description="unix seconds")] = None,
) -> list[SandboxMetric]:
    """Samples of the agent's /metrics in [start, end] (default: since the sandbox started)."""
    start_us = min(start, 2**42) * 1_000_000 if start is not None else None
    end_us = min(end, 2**42) * 1_000_000 + 999_999 if end is not None else None
    if start_us is not None and end_us is not None and start_us > end_us:
        raise ApiError(400, "start must not be after end")
    return [_metric(m) for m in await _orch(request).metrics(sandbox_id, start_us, end_us)]
