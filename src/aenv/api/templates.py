"""Template listing and alias lookup, for the templates the runtime has built."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from aenv.api.auth import require_api_key, team_of
from aenv.api.models import Error, Template, TemplateAlias
from aenv.machines.api import TemplateInfo, TemplateNotFound
from aenv.orchestrator.service import Orchestrator
from aenv.teams import names

router = APIRouter(
    dependencies=[Depends(require_api_key)],
    responses={s: {"model": Error} for s in (401, 404)},
)


def _orch(request: Request) -> Orchestrator:
    return request.app.state.orchestrator


def _template(t: TemplateInfo) -> Template:
    aliases = [names.shown(a) for a in t.aliases]
    return Template(
        templateID=names.shown(t.template_id),
        buildID=t.build_id,
        cpuCount=t.shape.vcpus,
        memoryMB=t.shape.memory_mib,
        diskSizeMB=t.shape.disk_mib,
        public=names.SEP not in t.template_id,
        aliases=aliases,
        names=aliases or [names.shown(t.template_id)],
        createdAt=t.created_at,
        updatedAt=t.created_at,
        envdVersion=t.envd_version,
        source=t.source,
        sizeBytes=t.size_bytes,
        sharedBytes=t.shared_bytes,
    )


@router.get("/templates", operation_id="listTemplates")
async def list_templates(request: Request) -> list[Template]:
    """The team's own templates and the public ones it does not shadow with its own."""
    team = team_of(request)
    seen = [t for t in _orch(request).templates(usage=True) if names.visible(t.template_id, team)]
    own = {names.shown(t.template_id) for t in seen if names.SEP in t.template_id}
    out = [_template(t) for t in seen
           if names.SEP in t.template_id or t.template_id not in own]  # fmt: skip
    return out + _on_its_way(_orch(request), team, {t.templateID for t in out})


def _on_its_way(orch: Orchestrator, team: str, listed: set[str]) -> list[Template]:
    """Templates being made (orchestrator.pending) that are not in the catalog yet: shown as
    `building` (an E2B build status), in the node's default shape."""
    shape, out = orch.config.default_shape, []
    for p in orch.pending.all():
        name = p.names[0]
        if not names.visible(name, team) or names.shown(name) in listed:
            continue
        listed.add(names.shown(name))
        out.append(Template(
            templateID=names.shown(name), buildID="", cpuCount=shape.vcpus,
            memoryMB=shape.memory_mib, diskSizeMB=shape.disk_mib, public=names.SEP not in name,
            aliases=[], names=[names.shown(name)], createdAt=p.since, updatedAt=p.since,
            envdVersion="", buildStatus="building", source=p.status()))
    return out


@router.get("/templates/aliases/{alias:path}", operation_id="getTemplateByAlias")
async def template_by_alias(request: Request, alias: str) -> TemplateAlias:
    """Another team's template is not found (404), never forbidden: the SDK reads a 403 as
    "the name is taken", and names are per team."""
    if ":" in alias:  # `name:tag` (verifiers asks `exists("<name>:default")`): that build
        try:
            t = find(request, alias)
        except TemplateNotFound:
            raise TemplateNotFound(f"template alias '{alias}' not found") from None
        # An earlier build kept for its tag is created from as its snapshot: its template
        # is the name (build status and tags are read by it).
        tid = t.aliases[0] if t.template_id == t.build_id and t.aliases else t.template_id
        return TemplateAlias(templateID=names.shown(tid), public=names.SEP not in tid)
    templates = _orch(request).templates()
    for n in names.candidates(alias, team_of(request)):
        for t in templates:
            if n in t.aliases or n == t.template_id:
                return TemplateAlias(templateID=names.shown(t.template_id),
                                     public=names.SEP not in t.template_id)  # fmt: skip
    raise TemplateNotFound(f"template alias '{alias}' not found")


def find(request: Request, name: str) -> TemplateInfo:
    """The team's template `name[:tag]`: its own, else a public one; TemplateNotFound."""
    for n in names.candidates(name, team_of(request)):
        try:
            return _orch(request).template(n)
        except TemplateNotFound:
            pass
    raise TemplateNotFound(f"template '{name}' not found")


@router.get("/templates/{template_id:path}", operation_id="getTemplate")
async def get_template(request: Request, template_id: str) -> Template:
    return _template(find(request, template_id))
