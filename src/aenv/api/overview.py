"""`GET /overview`, aenv's own: what the caller's team holds now and over the last hour
against its limits and, for an admin key, the node's (capacity, create and fork rates,
memory held). From the node's ring buffer (orchestrator/history.py); the console's overview
draws it (docs/console.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel

from aenv.api.auth import principal, require_api_key
from aenv.api.models import Error
from aenv.orchestrator.history import History, Holdings, Sample

router = APIRouter(dependencies=[Depends(require_api_key)],
                   responses={s: {"model": Error} for s in (400, 401)})  # fmt: skip
MIB = 1 << 20


class Now(BaseModel):
    running: int
    paused: int
    hot: int
    cold: int
    memoryMB: int


class Point(BaseModel):
    t: float  # unix seconds
    running: int
    paused: int
    memoryMB: int


class NodePoint(Point):
    createsPerMin: float
    forksPerMin: float
    heldMiB: float  # host memory the VMMs hold (PSS running, RSS hot)


class TeamOverview(BaseModel):
    teamID: str
    name: str
    maxSandboxes: int | None
    maxMemoryMB: int | None
    now: Now
    history: list[Point]


class NodeOverview(BaseModel):
    maxSandboxes: int
    now: Now
    history: list[NodePoint]


class Overview(BaseModel):
    sampleEveryS: float
    team: TeamOverview
    node: NodeOverview | None = None  # admin keys only


def _now(h: Holdings) -> Now:
    return Now(running=h.running, paused=h.paused, hot=h.hot, cold=h.cold,
               memoryMB=h.memory_mib)  # fmt: skip


def _point(t: float, h: Holdings) -> Point:
    return Point(t=t, running=h.running, paused=h.paused, memoryMB=h.memory_mib)


def _node_points(samples: list[Sample]) -> list[NodePoint]:
    out = []
    for prev, s in zip([None, *samples], samples, strict=False):
        dt = (s.t - prev.t) / 60 if prev is not None else 0
        out.append(NodePoint(
            **_point(s.t, s.node).model_dump(),
            createsPerMin=round((s.creates - prev.creates) / dt, 2) if prev and dt else 0.0,
            forksPerMin=round((s.forks - prev.forks) / dt, 2) if prev and dt else 0.0,
            heldMiB=round(s.held_bytes / MIB, 1)))  # fmt: skip
    return out


@router.get("/overview", operation_id="getOverview")
async def overview(request: Request,
                   window: Annotated[int, Query(ge=60, le=3600, description="seconds")] = 3600,
                   ) -> Overview:  # fmt: skip
    history: History = request.app.state.history
    who = principal(request)
    teams, node = history.holdings()
    team = request.app.state.orchestrator.teams.team(who.team_id)
    samples = history.since(history.now() - window)
    mine = Holdings()
    out = Overview(sampleEveryS=history.every_s, team=TeamOverview(
        teamID=team.team_id, name=team.name, maxSandboxes=team.max_sandboxes,
        maxMemoryMB=team.max_memory_mib, now=_now(teams.get(who.team_id, mine)),
        history=[_point(s.t, s.teams.get(who.team_id, mine)) for s in samples]))  # fmt: skip
    if who.admin:
        out.node = NodeOverview(maxSandboxes=request.app.state.orchestrator.config.max_sandboxes,
                                now=_now(node), history=_node_points(samples))  # fmt: skip
    return out
