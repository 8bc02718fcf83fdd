"""`POST /v3/templates/dockerfile`, aenv's own: a build from a Dockerfile's text, for clients
with no SDK (the web console). The E2B SDK the node already has parses it, exactly as
`Template.from_dockerfile` does for `aenv template build -f`, and the build then goes as any
E2B build (docs/api.md, "Template builds"). COPY and ADD need files, which this route does not
take: they are refused by name."""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from aenv.api.apierror import ApiError
from aenv.api.auth import require_api_key
from aenv.api.builds import BuildRequest, BuildRequested, request_build, start_build
from aenv.api.models import Error
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
    cpuCount: int | None = Field(None, ge=1, le=64)
    memoryMB: int | None = Field(None, ge=128, le=262144)


def parse(text: str) -> dict[str, Any]:
    """The build the SDK makes of a Dockerfile's text; ApiError 400 says what is wrong."""
    from e2b import Template
    from e2b.template.main import TemplateBase

    with tempfile.TemporaryDirectory(prefix="aenv-dockerfile-") as ctx:
        # The SDK takes a path or a text: a file, so that a text is never taken for a path.
        path = Path(ctx) / "Dockerfile"
        path.write_text(text)
        try:
            template = Template(file_context_path=ctx).from_dockerfile(str(path))
            for step in template._template._instructions:
                if step["type"].value == "COPY":
                    raise ValueError(f"COPY/ADD {' '.join(step['args'][:2])}: a Dockerfile "
                                     "given as text has no build context for its files")
            spec: dict[str, Any] = json.loads(TemplateBase.to_json(template))
        except (ValueError, KeyError, IndexError, OSError) as e:
            raise ApiError(400, f"the Dockerfile: {e}") from None
    return spec


@router.post("/v3/templates/dockerfile", operation_id="buildFromDockerfile", status_code=202)
async def build_from_dockerfile(request: Request, body: DockerfileBuild) -> BuildRequested:
    """Parse the Dockerfile, request the build and start it; follow it with
    getTemplateBuildStatus."""
    spec = BuildSpec.model_validate(await asyncio.to_thread(parse, body.dockerfile))
    if spec.fromImage and request.app.state.images is not None:
        request.app.state.images.check(spec.fromImage)  # 403 before a build is requested
    requested = await request_build(request, BuildRequest(
        name=body.name, cpuCount=body.cpuCount, memoryMB=body.memoryMB))  # fmt: skip
    await start_build(request, requested.templateID, requested.buildID, spec)
    return requested
