"""Named snapshots: take one of a running sandbox, list them, delete one.

A snapshot id is usable as `templateID` in a create (so is a snapshot name: the newest
snapshot carrying it). `DELETE /templates/{id}` is how E2B's SDK deletes a snapshot.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from aenv.api import query
from aenv.api.apierror import ApiError
from aenv.api.auth import require_api_key, team_of
from aenv.api.models import (
    Error,
    ListedSnapshot,
    SandboxForkRequest,
    SandboxForkResult,
    SandboxSnapshotRequest,
    SnapshotInfo,
)
from aenv.api.sandboxes import V2_CREATE_TIMEOUT_S, fork_results
from aenv.orchestrator import snapshots as snaps
from aenv.orchestrator.service import Orchestrator

router = APIRouter(
    dependencies=[Depends(require_api_key)],
    responses={s: {"model": Error} for s in (400, 401, 404, 409, 500, 507)},
)


def _orch(request: Request) -> Orchestrator:
    return request.app.state.orchestrator


@router.post("/sandboxes/{sandbox_id}/snapshots", operation_id="createSnapshot", status_code=201)
async def create_snapshot(
    request: Request, sandbox_id: str,
    body: Annotated[SandboxSnapshotRequest | None, Body()] = None,
) -> SnapshotInfo:
    """Snapshot a running sandbox (it keeps running). `name` (optional) is given to this
    snapshot and resolves to the newest snapshot carrying it. `memory: false` keeps the disk
    alone (filesystem-only): a sandbox created from it cold-boots that disk."""
    memory = body is None or body.memory is not False
    if body and body.name and body.name.startswith(snaps.INTERNAL_PREFIX):
        raise ApiError(400, f"snapshot names starting with {snaps.INTERNAL_PREFIX!r} are "
                       "reserved (the RL plane's)")  # fmt: skip
    info = await _orch(request).snapshot(sandbox_id, body.name if body else None, memory=memory)
    return SnapshotInfo(snapshotID=info.snapshot_id, names=list(info.names))


@router.post("/snapshots/{snapshot_id}/fork", operation_id="forkSnapshot", status_code=201,
             responses={201: {"model": list[SandboxForkResult]}})
async def fork_snapshot(
    request: Request, snapshot_id: str,
    body: Annotated[SandboxForkRequest | None, Body()] = None,
) -> JSONResponse:
    """aenv: `count` sandboxes (default 1, at most 20) from a named snapshot (id or name),
    restored side by side like a fork's children, each with its own id, token and entropy.
    `timeout` as a create's (default 300 s). The answer is a fork's."""
    count = body.count if body and body.count is not None else 1
    timeout = body.timeout if body and body.timeout is not None else V2_CREATE_TIMEOUT_S
    results = await _orch(request).fork_snapshot(snapshot_id, count, timeout,
                                                team_of(request))
    return fork_results(request, results)


@router.get("/snapshots", operation_id="listSnapshots")
async def list_snapshots(
    request: Request,
    response: Response,
    sandboxID: Annotated[str | None, Query(description="snapshots of this sandbox")] = None,
    name: Annotated[str | None, Query(description="a snapshot name or id")] = None,
    limit: Annotated[int | None, Query(ge=1, le=snaps.MAX_PAGE)] = None,
    nextToken: Annotated[str | None, Query()] = None,
) -> list[ListedSnapshot]:
    """Newest first; `x-next-token` is set only when another page exists."""
    items, nxt = _orch(request).list_snapshots(
        sandbox_id=sandboxID or None, name=name or None, limit=limit or snaps.MAX_PAGE,
        cursor=query.decode_cursor(nextToken), team_id=team_of(request),
    )  # fmt: skip
    if nxt is not None:
        response.headers["x-next-token"] = query.encode_cursor(nxt)
    query.cluster_cursors(request, response,
                          [(snaps.created_us(s), s.snapshot_id) for s in items])  # fmt: skip
    runtime = _orch(request).runtime
    sizes = await asyncio.to_thread(lambda: [runtime.snapshot_bytes(s.snapshot_id)
                                             for s in items])  # fmt: skip
    return [ListedSnapshot(snapshotID=s.snapshot_id, names=list(s.names), createdAt=s.created_at,
                           sandboxID=s.parent, templateID=s.template, sizeBytes=size)
            for s, size in zip(items, sizes, strict=True)]  # fmt: skip


@router.delete("/templates/{template_id:path}", operation_id="deleteSnapshot",
               status_code=204, response_class=Response)
async def delete_snapshot(request: Request, template_id: str) -> Response:
    """Delete a snapshot: it leaves listings at once; its space is reclaimed when nothing
    uses it. Templates themselves are not deleted through the API (400)."""
    _orch(request).delete_snapshot(template_id, team_of(request))
    return Response(status_code=204)
