"""E2B's template build API, as the SDK's `Template.build` uses it (docs/api.md, "Template
builds"). Included before `templates.py`, whose `/templates/{id:path}` routes would
otherwise swallow `/templates/{id}/files/...`, `/builds/...` and `/tags`."""

from __future__ import annotations

import re

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, Field

from aenv.api import templates
from aenv.api.apierror import ApiError
from aenv.api.auth import require_api_key, team_of
from aenv.api.internal import client_origin
from aenv.api.models import Error
from aenv.images.builds import Build, BuildNotFound, Builds
from aenv.images.context import ContextError
from aenv.images.steps import BuildSpec, StepError
from aenv.machines.api import TemplateNotFound
from aenv.teams import names

router = APIRouter(
    dependencies=[Depends(require_api_key)],
    responses={s: {"model": Error} for s in (400, 401, 404)},
)
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
TAG_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
LEVELS = ("debug", "info", "warn", "error")


def node_builds(request: Request) -> Builds:
    builds = getattr(request.app.state, "builds", None)
    if builds is None:
        raise ApiError(400, "this node builds no templates (its runtime has no VMs)")
    return builds


class BuildRequest(BaseModel):
    name: str = Field(max_length=128)
    tags: list[str] = Field(default_factory=list, max_length=64)
    cpuCount: int | None = Field(None, ge=1, le=64)
    memoryMB: int | None = Field(None, ge=128, le=262144)
    minFreeDiskMb: int | None = Field(None, ge=0)


class BuildRequested(BaseModel):
    templateID: str
    buildID: str
    public: bool = False
    names: list[str]
    tags: list[str]
    aliases: list[str]


def split_name(text: str) -> tuple[str, str | None]:
    """`name[:tag]`, checked; ApiError 400 names what is wrong."""
    name, sep, tag = text.partition(":")
    if not NAME_RE.fullmatch(name):
        raise ApiError(400, f"invalid template name {name!r}: 1-128 lowercase letters, digits "
                            "and . _ -, starting with a letter or digit")  # fmt: skip
    if sep and not TAG_RE.fullmatch(tag):
        raise ApiError(400, f"invalid tag {tag!r} in {text!r}")
    return name, tag if sep else None


@router.post("/v3/templates", operation_id="requestTemplateBuild", status_code=202)
async def request_build(request: Request, body: BuildRequest) -> BuildRequested:
    builds = node_builds(request)
    name, tag = split_name(body.name)
    tags = [t for t in [tag, *body.tags] if t]
    for t in tags:
        if not TAG_RE.fullmatch(t):
            raise ApiError(400, f"invalid tag {t!r}")
    shape = builds.cfg.default_shape.model_copy(update={
        k: v for k, v in (("vcpus", body.cpuCount), ("memory_mib", body.memoryMB))
        if v is not None})  # fmt: skip
    own = names.scoped(name, team_of(request))  # names are per team (teams/names.py)
    b = builds.request(own, [own], tags or ["default"], shape)
    return BuildRequested(templateID=name, buildID=b.build_id, names=[name], tags=b.tags,
                          aliases=[name])  # fmt: skip


class FileUpload(BaseModel):
    present: bool
    url: str | None = None


@router.get("/templates/{template_id}/files/{files_hash}", operation_id="getTemplateFiles",
            status_code=201, response_model_exclude_none=True)  # fmt: skip
async def build_files(request: Request, template_id: str, files_hash: str) -> FileUpload:
    builds = node_builds(request)
    split_name(template_id)
    try:
        if builds.contexts.present(files_hash):
            return FileUpload(present=True)
        path = builds.contexts.upload_path(files_hash)
    except ContextError as e:
        raise ApiError(400, str(e)) from None
    # The client's own origin (or the configured public URL), so it works behind a gateway.
    origin = builds.cfg.public_url or client_origin(request)
    return FileUpload(present=False, url=origin.rstrip("/") + path)


@router.post("/v2/templates/{template_id}/builds/{build_id}", operation_id="startTemplateBuild",
             status_code=202)  # fmt: skip
async def start_build(request: Request, template_id: str, build_id: str,
                      spec: BuildSpec) -> Response:
    builds = node_builds(request)
    try:
        b = builds.get(names.scoped(template_id, team_of(request)), build_id)
        if spec.fromTemplate:  # the team's own, else a public one
            spec.fromTemplate = templates.find(request, spec.fromTemplate).template_id
        elif spec.fromImage and request.app.state.images is not None:
            request.app.state.images.check(spec.fromImage, team_of(request))  # 403 outside
        builds.start(b, spec)
    except (BuildNotFound, TemplateNotFound) as e:
        raise ApiError(404, str(e)) from None
    except StepError as e:
        raise ApiError(400, str(e)) from None
    return Response(status_code=202)


@router.delete("/templates/{template_id}/builds/{build_id}", operation_id="cancelTemplateBuild",
               status_code=204)  # fmt: skip
async def cancel_build(request: Request, template_id: str, build_id: str) -> Response:
    """aenv's own (E2B has none): stop a running build; nothing of it is kept."""
    builds = node_builds(request)
    try:
        await builds.cancel(builds.get(names.scoped(template_id, team_of(request)), build_id))
    except BuildNotFound as e:
        raise ApiError(404, str(e)) from None
    except StepError as e:
        raise ApiError(409, str(e)) from None
    return Response(status_code=204)


def _status(b: Build, offset: int, limit: int, level: str | None) -> dict[str, object]:
    rank = LEVELS.index(level) if level in LEVELS else 0
    entries = [x for x in b.logs[offset:offset + limit]
               if LEVELS.index(x.level) >= rank if x.level in LEVELS]  # fmt: skip
    out: dict[str, object] = {
        "templateID": b.template_id, "buildID": b.build_id, "status": b.status,
        "logs": [x.message for x in entries],
        "logEntries": [{k: v for k, v in vars(x).items() if v is not None} for x in entries],
    }  # fmt: skip
    if b.reason is not None:
        out["reason"] = b.reason
    return out


@router.get("/templates/{template_id}/builds/{build_id}/status",
            operation_id="getTemplateBuildStatus")  # fmt: skip
async def build_status(request: Request, template_id: str, build_id: str,
                       logsOffset: int = Query(0, ge=0), limit: int = Query(100, ge=0, le=100),
                       level: str | None = None) -> dict[str, object]:
    builds = node_builds(request)
    try:
        b = builds.get(names.scoped(template_id, team_of(request)), build_id)
    except BuildNotFound as e:
        raise ApiError(404, str(e)) from None
    return _status(b, logsOffset, limit, level)


class AssignTags(BaseModel):
    target: str
    tags: list[str] = Field(min_length=1, max_length=64)


class DeleteTags(BaseModel):
    name: str
    tags: list[str] = Field(min_length=1, max_length=64)


@router.post("/templates/tags", operation_id="assignTemplateTags", status_code=201)
async def assign_tags(request: Request, body: AssignTags) -> dict[str, object]:
    builds = node_builds(request)
    name, tag = split_name(body.target)
    for t in body.tags:
        if not TAG_RE.fullmatch(t):
            raise ApiError(400, f"invalid tag {t!r}")
    if body.target.endswith(":") or body.target.startswith(":"):
        raise ApiError(400, f"invalid target {body.target!r}: NAME[:TAG]")
    try:
        t = builds.tag(names.scoped(name, team_of(request)), tag, body.tags)
    except TemplateNotFound as e:
        raise ApiError(404, str(e)) from None
    return {"tags": list(body.tags), "buildID": t.e2b_build_id}


@router.delete("/templates/tags", operation_id="deleteTemplateTags", status_code=204)
async def delete_tags(request: Request, body: DeleteTags) -> Response:
    builds = node_builds(request)
    name, _ = split_name(body.name)
    try:
        builds.untag(names.scoped(name, team_of(request)), body.tags)
    except TemplateNotFound as e:
        raise ApiError(404, str(e)) from None
    return Response(status_code=204)


@router.get("/templates/{template_id}/tags", operation_id="getTemplateTags")
async def get_tags(request: Request, template_id: str) -> list[dict[str, str]]:
    builds = node_builds(request)
    name, _ = split_name(template_id)
    try:
        t = builds.template(templates.find(request, name).template_id)
    except TemplateNotFound as e:
        raise ApiError(404, str(e)) from None
    return [{"tag": tag, "buildID": b.e2b_build_id, "createdAt": b.created_at}
            for b in [t, *t.versions] for tag in b.tags]  # fmt: skip
