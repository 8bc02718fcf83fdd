"""E2B's volume API: the control plane (`/volumes`, with the API key) and the content API
(`/volumecontent/{id}/...`, with the volume's token as `Authorization: Bearer`).

The content API is served beside the control plane, so clients set `E2B_VOLUME_API_URL` to
the node's URL, or, with TLS and a domain, reach it at `api.<domain>` from the `domain` the
volume's answer carries. Uploads bypass the control plane's body cap (app.py) and stream to
disk; reads stream from it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response, Security
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from aenv.api.apierror import ApiError
from aenv.api.auth import require_api_key, team_of
from aenv.api.models import Error
from aenv.orchestrator import mounts
from aenv.orchestrator.service import Orchestrator
from aenv.storage.extents import tree_usage
from aenv.volumes import tree as vtree
from aenv.volumes.store import VolumeError, VolumeInfo, Volumes, token_for, token_ok

T = TypeVar("T")
CONTENT_PREFIX = "/volumecontent/"
_IDS = Annotated[int | None, Query(ge=0, le=2**32 - 2)]
_MODE = Annotated[int | None, Query(ge=0, le=0o7777)]

router = APIRouter(dependencies=[Depends(require_api_key)],
                   responses={s: {"model": Error} for s in (400, 401, 404, 409)})  # fmt: skip
# Declared for the OpenAPI document (the token is checked in `_tree`, per volume).
_bearer = HTTPBearer(auto_error=False, description="the volume's token")
content = APIRouter(dependencies=[Security(_bearer)],
                    responses={s: {"model": Error} for s in (400, 401, 404, 409)})  # fmt: skip


class NewVolume(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr


class VolumeAndToken(BaseModel):
    volumeID: str
    name: str
    token: str
    domain: str | None = None


class ListedVolume(BaseModel):
    volumeID: str
    name: str
    sizeBytes: int = 0  # aenv: the data bytes of its files


class Metadata(BaseModel):
    model_config = ConfigDict(extra="ignore")
    uid: Annotated[StrictInt, Field(ge=0, le=2**32 - 2)] | None = None
    gid: Annotated[StrictInt, Field(ge=0, le=2**32 - 2)] | None = None
    mode: Annotated[StrictInt, Field(ge=0, le=0o7777)] | None = None


# E2B's VolumeEntryStat: the tree's own entry, as FastAPI serialises a dataclass.
VolumeEntryStat = vtree.Entry


def _orch(request: Request) -> Orchestrator:
    return request.app.state.orchestrator


def _volumes(request: Request) -> Volumes:
    vols = _orch(request).volumes
    assert vols is not None  # routes run between start and close
    return vols


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return await fn(*args)
    except VolumeError as e:
        raise ApiError(e.status, str(e)) from None


def _with_token(request: Request, v: VolumeInfo) -> VolumeAndToken:
    # The SDK puts `api.` before a domain: only a node that serves api.<domain> names one.
    domain = request.app.state.domain if _orch(request).config.tls_cert_file else None
    return VolumeAndToken(volumeID=v.volume_id, name=v.name, domain=domain,
                          token=token_for(_orch(request).secrets_key, v.volume_id))  # fmt: skip


@router.post("/volumes", operation_id="createVolume", status_code=201,
             response_model_exclude_none=True)  # fmt: skip
async def create_volume(request: Request, body: NewVolume) -> VolumeAndToken:
    return _with_token(request, await _call(_volumes(request).create, body.name,
                                           team_of(request)))


@router.get("/volumes", operation_id="listVolumes")
async def list_volumes(request: Request) -> list[ListedVolume]:
    vols = _volumes(request)
    listed = await _call(vols.list, team_of(request))
    sizes = await asyncio.to_thread(lambda: [tree_usage(vols.root / v.volume_id).total
                                             for v in listed])  # fmt: skip
    return [ListedVolume(volumeID=v.volume_id, name=v.name, sizeBytes=size)
            for v, size in zip(listed, sizes, strict=True)]  # fmt: skip


@router.get("/volumes/{volume_id}", operation_id="getVolume", response_model_exclude_none=True)
async def get_volume(request: Request, volume_id: str) -> VolumeAndToken:
    """By id (or name); its content token with it."""
    return _with_token(request, await _call(_volumes(request).get, volume_id,
                                           team_of(request)))


@router.delete("/volumes/{volume_id}", operation_id="deleteVolume", status_code=204,
               response_class=Response)  # fmt: skip
async def delete_volume(request: Request, volume_id: str) -> Response:
    """Refused (409) while a sandbox mounts it, running or paused, on this node or (in a
    cluster) any other: its data would vanish under the guest."""
    orch = _orch(request)
    team = team_of(request)
    info = await _call(_volumes(request).get, volume_id, team)
    users = mounts.volume_users(orch.store, info.volume_id) or \
        await _call(_volumes(request).users_elsewhere, info.volume_id)
    if users:
        raise ApiError(409, f"volume {info.name!r} is mounted by {len(users)} sandbox(es), "
                       f"e.g. {users[0]}: kill them first")  # fmt: skip
    await _call(_volumes(request).delete, info.volume_id, team)
    return Response(status_code=204)


# -- content -----------------------------------------------------------------------------


def content_auth_ok(request: Request) -> bool:
    """Whether a content request carries its volume's token (errors.py asks too, so that
    a malformed request without one gets 401, not 400)."""
    volume_id = request.url.path.removeprefix(CONTENT_PREFIX).partition("/")[0]
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and token_ok(_orch(request).secrets_key, volume_id,
                                                   given.strip())  # fmt: skip


async def _tree(request: Request, volume_id: str) -> vtree.Tree:
    """The volume's tree, for a request with its token (401 otherwise, before any lookup,
    so a wrong token learns nothing about which volumes exist)."""
    if not content_auth_ok(request):
        raise ApiError(401, "invalid or missing volume token (Authorization: Bearer <token>)")
    vols = _volumes(request)
    info = await _call(vols.get, volume_id, None)
    return vtree.Tree(vols.root / info.volume_id)


async def _run(fn: Callable[..., T], *args: Any) -> T:
    try:
        return await asyncio.to_thread(fn, *args)
    except vtree.PathError as e:
        raise ApiError(e.status, str(e)) from None


@content.get(CONTENT_PREFIX + "{volume_id}/dir", operation_id="listVolumeDir")
async def list_dir(request: Request, volume_id: str, path: str,
                   depth: Annotated[int, Query(ge=1, le=vtree.MAX_DEPTH)] = 1,
                   ) -> list[VolumeEntryStat]:  # fmt: skip
    tree = await _tree(request, volume_id)
    return await _run(tree.list, path, depth)


@content.post(CONTENT_PREFIX + "{volume_id}/dir", operation_id="makeVolumeDir", status_code=201)
async def make_dir(request: Request, volume_id: str, path: str, uid: _IDS = None,
                   gid: _IDS = None, mode: _MODE = None, force: bool = False,
                   ) -> VolumeEntryStat:  # fmt: skip
    """mkdir; `force`: its parents too, and an existing directory is fine."""
    tree = await _tree(request, volume_id)
    return await _run(tree.make_dir, path, uid, gid, mode, force)


@content.get(CONTENT_PREFIX + "{volume_id}/path", operation_id="statVolumePath")
async def stat_path(request: Request, volume_id: str, path: str) -> VolumeEntryStat:
    """The entry itself (a symlink is reported as one, with its target)."""
    tree = await _tree(request, volume_id)
    return await _run(tree.stat, path)


@content.patch(CONTENT_PREFIX + "{volume_id}/path", operation_id="updateVolumePathMetadata")
async def patch_path(request: Request, volume_id: str, path: str,
                     body: Metadata) -> VolumeEntryStat:  # fmt: skip
    tree = await _tree(request, volume_id)
    return await _run(tree.set_metadata, path, body.uid, body.gid, body.mode)


@content.delete(CONTENT_PREFIX + "{volume_id}/path", operation_id="removeVolumePath",
                status_code=204, response_class=Response)  # fmt: skip
async def remove_path(request: Request, volume_id: str, path: str) -> Response:
    """A file, a symlink or a directory with everything in it."""
    tree = await _tree(request, volume_id)
    await _run(tree.remove, path)
    return Response(status_code=204)


@content.get(CONTENT_PREFIX + "{volume_id}/file", operation_id="readVolumeFile",
             response_class=StreamingResponse)  # fmt: skip
async def read_file(request: Request, volume_id: str, path: str) -> StreamingResponse:
    tree = await _tree(request, volume_id)
    fd, size = await _run(tree.open_read, path)

    async def body() -> AsyncIterator[bytes]:
        try:
            while chunk := await asyncio.to_thread(os.read, fd, vtree.CHUNK):
                yield chunk
        finally:
            os.close(fd)

    return StreamingResponse(body(), media_type="application/octet-stream",
                             headers={"content-length": str(size)})  # fmt: skip


@content.put(CONTENT_PREFIX + "{volume_id}/file", operation_id="writeVolumeFile",
             status_code=201)  # fmt: skip
async def write_file(request: Request, volume_id: str, path: str, uid: _IDS = None,
                     gid: _IDS = None, mode: _MODE = None, force: bool = True,
                     ) -> VolumeEntryStat:  # fmt: skip
    """Creates or replaces the file (parents made), atomically: readers see the old content
    or the new, never part. `force=false` refuses to replace an existing file (409)."""
    tree = await _tree(request, volume_id)
    if not force:
        try:
            await _run(tree.stat, path)
        except ApiError as e:
            if e.status != 404:
                raise
        else:
            raise ApiError(409, f"path {path!r} exists (force=false)")
    pfd, fd, tmp = await _run(tree.begin_write, path)
    try:
        async for chunk in request.stream():
            if chunk:
                await _run(_write_all, fd, chunk)
    except BaseException:
        tree.abort_write(pfd, fd, tmp)
        raise
    return await _run(tree.commit_write, path, pfd, fd, tmp, uid, gid, mode)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except OSError as e:
            raise vtree.PathError(f"write failed: {e.strerror}") from None
        view = view[n:]
