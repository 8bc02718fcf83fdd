"""Template listing and alias lookup, for the templates the runtime has built."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from aenv.api.auth import require_api_key
from aenv.api.models import Error, Template, TemplateAlias
from aenv.machines.api import TemplateInfo, TemplateNotFound
from aenv.orchestrator.service import Orchestrator

router = APIRouter(
    dependencies=[Depends(require_api_key)],
    responses={s: {"model": Error} for s in (401, 404)},
)


def _orch(request: Request) -> Orchestrator:
    return request.app.state.orchestrator


def _template(t: TemplateInfo) -> Template:
    return Template(
        templateID=t.template_id,
        buildID=t.build_id,
        cpuCount=t.shape.vcpus,
        memoryMB=t.shape.memory_mib,
        diskSizeMB=t.shape.disk_mib,
        public=False,
        aliases=list(t.aliases),
        names=list(t.aliases) or [t.template_id],
        createdAt=t.created_at,
        updatedAt=t.created_at,
        envdVersion=t.envd_version,
        source=t.source,
        sizeBytes=t.size_bytes,
        sharedBytes=t.shared_bytes,
    )


@router.get("/templates", operation_id="listTemplates")
async def list_templates(request: Request) -> list[Template]:
    return [_template(t) for t in _orch(request).templates(usage=True)]


@router.get("/templates/aliases/{alias:path}", operation_id="getTemplateByAlias")
async def template_by_alias(request: Request, alias: str) -> TemplateAlias:
    for t in _orch(request).templates():
        if alias in t.aliases or alias == t.template_id:
            return TemplateAlias(templateID=t.template_id, public=False)
    raise TemplateNotFound(f"template alias '{alias}' not found")


@router.get("/templates/{template_id:path}", operation_id="getTemplate")
async def get_template(request: Request, template_id: str) -> Template:
    return _template(_orch(request).template(template_id))
