"""`POST /v3/templates/dockerfile`, aenv's own: a build from a Dockerfile's text and, for its
COPY steps, the build context as one tar (base64), for clients with no SDK (the web console).
The node's SDK parses it as `Template.from_dockerfile` does for `aenv template build -f`
(images/dockerfile.py), the COPY files are stored as the SDK's uploads would be, and the
build then goes as any E2B build (docs/api.md, "Template builds")."""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from aenv.api.apierror import ApiError
from aenv.api.auth import require_api_key, team_of
from aenv.api.builds import BuildRequest, BuildRequested, node_builds, request_build, start_build
from aenv.api.models import Error
from aenv.images import dockerfile
from aenv.images.context import ContextStore
from aenv.images.steps import BuildSpec

router = APIRouter(
    dependencies=[Depends(require_api_key)],
    responses={s: {"model": Error} for s in (400, 401, 403, 404)},
)
MAX_DOCKERFILE = 256 * 1024


class DockerfileBuild(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: StrictStr = Field(max_length=128)  # name[:tag]
    dockerfile: StrictStr = Field(min_length=1, max_length=MAX_DOCKERFILE)
    # The COPY sources: a tar (or tar.gz), base64; the request's 1 MiB bounds it.
    context: StrictStr | None = None
    cpuCount: int | None = Field(None, ge=1, le=64)
    memoryMB: int | None = Field(None, ge=128, le=262144)


def prepare(text: str, context: bytes | None, contexts: ContextStore | None) -> dict[str, Any]:
    """The build's spec, its files stored; ApiError 400 says what is wrong."""
    try:
        with dockerfile.parsed(text, context) as template:
            out = dockerfile.spec(template)
            if contexts is not None:
                dockerfile.store_files(template, contexts)
    except dockerfile.DockerfileError as e:
        raise ApiError(400, str(e)) from None
    return out


@router.post("/v3/templates/dockerfile", operation_id="buildFromDockerfile", status_code=202)
async def build_from_dockerfile(request: Request, body: DockerfileBuild) -> BuildRequested:
    """Parse the Dockerfile, store its files, request the build and start it; follow it with
    getTemplateBuildStatus."""
    try:
        context = base64.b64decode(body.context, validate=True) if body.context else None
    except (binascii.Error, ValueError):
        raise ApiError(400, "context: not base64") from None
    builds = node_builds(request)
    spec = BuildSpec.model_validate(
        await asyncio.to_thread(prepare, body.dockerfile, context, builds.contexts))
    if spec.fromImage and request.app.state.images is not None:
        request.app.state.images.check(spec.fromImage, team_of(request))  # 403 before
    requested = await request_build(request, BuildRequest(
        name=body.name, cpuCount=body.cpuCount, memoryMB=body.memoryMB))  # fmt: skip
    await start_build(request, requested.templateID, requested.buildID, spec)
    return requested
