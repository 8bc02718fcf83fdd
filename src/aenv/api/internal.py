"""A node's routes for its cluster's gateways (`cluster/wire.py`), under `/cluster/v1`,
authenticated by the cluster token rather than an API key; 404 on a node without one.

- `GET /cluster/v1/sandboxes/{id}`: whether this node holds the sandbox (200 with its
  public state, or 404). A gateway asks when it finds no binding yet (a fork child or a
  direct create bound within a second of its creation).
- `GET /cluster/v1/volume-users/{id}`: this node's sandboxes that mount the volume
  (`{"sandboxes": [...]}`): a node deleting a volume asks every other one first.
- `GET /cluster/v1/signed-files?<the /files query>&method=GET|POST`: which of this node's
  sandboxes a signed `/files` URL is for (200 `{sandboxID}`, or 404). Such a URL carries
  no sandbox id, and tokens never leave their node, so a gateway asks the nodes.
- `GET /cluster/v1/snapshots/{id or name}`: a snapshot this node holds, described for a
  peer that fetches it (`store.published.Published`: its files as chunk digests, its
  manifest, what a node must match to restore it), or 404.
- `GET /cluster/v1/snapshot-files/{id}/{state|memory|disk}`: that snapshot's files, with
  range requests (the peer fetches the chunks it lacks).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse, Response
from pydantic import BaseModel, ValidationError

from aenv.api.apierror import ApiError
from aenv.api.cluster_caller import from_cluster
from aenv.api.sandboxes import fork_results
from aenv.api.takeover import sharing_of
from aenv.cluster import wire
from aenv.cluster.takeover import record_of, sealer_of
from aenv.machines.api import TemplateNotFound
from aenv.orchestrator import mounts
from aenv.orchestrator.states import PUBLIC_STATE
from aenv.secrets.vault import VaultError
from aenv.storage.snapshots import FILES, SnapshotCorrupt, SnapshotNotFound


def client_origin(request: Request) -> str:
    """The origin the client called: a gateway's (it says so, with the cluster token), else
    this node's."""
    origin = request.headers.get(wire.ORIGIN_HEADER)
    if origin and from_cluster(request):
        return origin
    return f"{request.url.scheme}://{request.url.netloc}"


async def _require_cluster_token(request: Request) -> None:
    if not from_cluster(request):
        raise ApiError(404, "Not Found")  # no hint that the routes exist


router = APIRouter(prefix=wire.INTERNAL_PREFIX, include_in_schema=False,
                   dependencies=[Depends(_require_cluster_token)])  # fmt: skip


@router.get("/sandboxes/{sandbox_id}")
async def held(request: Request, sandbox_id: str) -> dict[str, str]:
    rec = request.app.state.orchestrator.store.get(sandbox_id)
    if rec is None or rec.state not in PUBLIC_STATE:
        raise ApiError(404, f"sandbox {sandbox_id} is not on this node")
    return {"sandboxID": sandbox_id, "state": PUBLIC_STATE[rec.state]}


@router.get("/volume-users/{volume_id}")
async def volume_users(request: Request, volume_id: str) -> dict[str, list[str]]:
    """The sandboxes of this node, running or paused, that mount the volume (a delete at
    another node asks every node first)."""
    return {"sandboxes": mounts.volume_users(request.app.state.orchestrator.store, volume_id)}


@router.get("/signed-files")
async def signed_files(
    request: Request, method: Annotated[str, Query(pattern="^(GET|POST)$")]
) -> dict[str, str]:
    params = parse_qs(request.url.query)
    route = request.app.state.proxy.find_signed(method, params)
    if route is None:
        raise ApiError(404, "no sandbox of this node signed it")
    return {"sandboxID": route.sandbox_id}


@router.get("/snapshots/{name:path}")
async def snapshot_doc(request: Request, name: str) -> Response:
    sharing = sharing_of(request)
    try:
        pub = await asyncio.to_thread(sharing.describe, name)
    except (TemplateNotFound, SnapshotNotFound, SnapshotCorrupt):
        raise ApiError(404, f"snapshot {name!r} is not on this node") from None
    return Response(pub.model_dump_json(), media_type="application/json")


@router.get("/snapshot-files/{snapshot_id}/{file}")
async def snapshot_file(request: Request, snapshot_id: str, file: str) -> FileResponse:
    sharing = sharing_of(request)
    try:
        man = sharing.snapshots.get(snapshot_id)
    except (SnapshotNotFound, SnapshotCorrupt):
        raise ApiError(404, f"snapshot {snapshot_id!r} is not on this node") from None
    if file not in FILES or file not in man.files:
        raise ApiError(404, f"snapshot {snapshot_id!r} has no file {file!r}")
    return FileResponse(sharing.snapshots.path(snapshot_id) / file,
                        media_type="application/octet-stream")


class ForkSource(BaseModel):
    node: str
    url: str


class ForkChildren(BaseModel):
    """What a fork's node sends a node with room for some of its children."""

    snapshot: str
    source: ForkSource
    children: list[dict[str, Any]]


@router.post("/fork-children")
async def fork_children(request: Request) -> Any:
    """Children of a fork on another node that lacked room for them: their records and the
    fork's snapshot (fetched from that node) are here; one entry each, as a fork's."""
    try:
        body = ForkChildren.model_validate_json(await request.body())
        sealer = sealer_of(request.app.state.orchestrator.secrets_key)
        kids = [record_of(k, sealer) for k in body.children]
    except (ValidationError, KeyError, TypeError, ValueError, VaultError):
        raise ApiError(400, "expected {snapshot, source: {node, url}, children: [sandbox "
                       "records]}") from None  # fmt: skip
    results = await sharing_of(request).forks.here(body.snapshot, body.source.node,
                                                   body.source.url, kids)  # fmt: skip
    return fork_results(request, results)
