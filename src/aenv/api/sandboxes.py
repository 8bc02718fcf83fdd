"""Control-plane sandbox routes: parse, call one orchestrator action, map the result."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from fastapi.responses import JSONResponse

from aenv.api import query, templates
from aenv.api.apierror import ApiError
from aenv.api.auth import require_api_key, team_of
from aenv.api.cluster_caller import from_cluster
from aenv.api.models import (
    ConnectSandbox,
    Error,
    HostMemory,
    Lifecycle,
    ListedSandbox,
    NetworkInfo,
    NewSandbox,
    ResumedSandbox,
    Sandbox,
    SandboxDetail,
    SandboxForkRequest,
    SandboxForkResult,
    SandboxNetwork,
    SandboxNetworkUpdate,
    SandboxPauseRequest,
    SandboxRefresh,
    SandboxTimeout,
)
from aenv.api.takeover import take_over_if_moved
from aenv.cluster import wire
from aenv.machines.api import TemplateNotFound
from aenv.network.transforms import to_json as rules_to_json
from aenv.orchestrator.errors import Unsupported
from aenv.orchestrator.orphans import Claim
from aenv.orchestrator.service import CreateRequest, Orchestrator
from aenv.orchestrator.states import PUBLIC_STATE, states_for_public
from aenv.orchestrator.store import ListQuery, SandboxRecord
from aenv.teams import names

V2_CREATE_TIMEOUT_S = 300
V1_CREATE_TIMEOUT_S = 15
V1_RESUME_TIMEOUT_S = 15
CONNECT_TIMEOUT_S = 300
MAX_PAGE = 100

_errors: dict[int | str, dict[str, object]] = {
    s: {"model": Error} for s in (400, 401, 404, 409, 429, 500, 507)
}
MIB = 1 << 20
log = logging.getLogger("aenv.api")
router = APIRouter(dependencies=[Depends(require_api_key)], responses=_errors)


def _orch(request: Request) -> Orchestrator:
    return request.app.state.orchestrator


def _sandbox(request: Request, rec: SandboxRecord) -> Sandbox:
    fields: dict[str, object] = {
        "templateID": names.shown(rec.template_id),
        "sandboxID": rec.sandbox_id,
        "clientID": _orch(request).client_id,
        "envdVersion": rec.envd_version,
        "alias": rec.alias and names.shown(rec.alias),
        "trafficAccessToken": rec.ingress.traffic_token,
        "domain": request.app.state.domain,
    }
    if rec.access_token is not None:
        fields["envdAccessToken"] = rec.access_token
    return Sandbox(**fields)


def _listed_fields(request: Request, rec: SandboxRecord) -> dict[str, object]:
    paused = PUBLIC_STATE[rec.state] == "paused"
    return {
        "templateID": names.shown(rec.template_id),
        "alias": rec.alias and names.shown(rec.alias),
        "sandboxID": rec.sandbox_id,
        "clientID": _orch(request).client_id,
        "startedAt": query.rfc3339(rec.started_at_us),
        "endAt": query.rfc3339(rec.end_at_us),
        "envdVersion": rec.envd_version,
        "cpuCount": rec.vcpus,
        "memoryMB": rec.memory_mib,
        "diskSizeMB": rec.disk_mib,
        "state": PUBLIC_STATE[rec.state],
        "metadata": rec.metadata,
        "pauseTier": _orch(request).runtime.tier(rec.sandbox_id) if paused else None,
    } | ({"volumeMounts": [{"name": n, "path": p} for n, p, _ in rec.volume_mounts]}
         if rec.volume_mounts else {}) | _reach(request, rec)  # fmt: skip


def _reach(request: Request, rec: SandboxRecord) -> dict[str, object]:
    """aenv: whether a running sandbox's agent answers the node's probes (orchestrator/
    reachability.py), and when it last did."""
    if PUBLIC_STATE[rec.state] != "running":
        return {}
    r = _orch(request).reachability.of(rec.sandbox_id)
    out: dict[str, object] = {"envdReachable": r.reachable}
    if r.last_reached_us is not None:
        out["envdLastReachedAt"] = query.rfc3339(r.last_reached_us)
    return out


def _template_filter(request: Request, template: str) -> str:
    """The node's name of the team's `template` (its own, else a public one)."""
    try:
        return templates.find(request, template).template_id
    except TemplateNotFound:
        return template  # a snapshot's id, or nothing of the team's: matches what it matches


def _network_info(rec: SandboxRecord) -> NetworkInfo:
    e = rec.egress
    info = NetworkInfo(allowOut=[*map(str, e.allow_out), *e.domains],
                       denyOut=[str(n) for n in e.deny_out])  # fmt: skip
    if e.dns_servers is not None:  # set only then: the SDK reads a null as a list
        info.dnsServers = list(e.dns_servers)
    if e.egress_proxy is not None:
        info.egressProxy = e.egress_proxy.info()
    if e.rules:
        info.rules = rules_to_json(e.rules)
    i = rec.ingress
    info.allowPublicTraffic = i.traffic_token is None
    if i.mask_host is not None:
        info.maskRequestHost = i.mask_host
    if i.https_ports:
        info.httpsPorts = sorted(i.https_ports)
    return info


def _detail(request: Request, rec: SandboxRecord, host_memory: HostMemory | None = None
            ) -> SandboxDetail:  # fmt: skip
    fields = _listed_fields(request, rec) | {
        "domain": request.app.state.domain,
        "allowInternetAccess": rec.allow_internet,
        "network": _network_info(rec),
        "lifecycle": Lifecycle(
            onTimeout="pause" if rec.auto_pause else "kill", autoResume=rec.auto_resume
        ),
    }
    if PUBLIC_STATE[rec.state] == "paused":
        fields["pauseMode"] = rec.pause_mode or "full"
    if rec.access_token is not None:
        fields["envdAccessToken"] = rec.access_token
    if host_memory is not None:
        fields["hostMemory"] = host_memory
    if rec.forked_from is not None:
        fields["forkedFrom"] = rec.forked_from
    forks = _orch(request).store.forks_of(rec.sandbox_id)
    if forks:
        fields["forks"] = forks
    return SandboxDetail(**fields)


async def _host_memory(request: Request, rec: SandboxRecord) -> HostMemory | None:
    """What the sandbox's VMM holds, measured now (a runtime without VMMs has nothing)."""
    pager = getattr(_orch(request).runtime, "pager", None)  # machines/paging.py
    if pager is None or PUBLIC_STATE[rec.state] != "running":
        return None
    m = await asyncio.to_thread(pager.host_memory, rec.sandbox_id)
    if m is None:
        return None
    return HostMemory(residentMiB=round(m.resident / MIB, 1), sharedMiB=round(m.shared / MIB, 1),
                      ownMiB=round(m.own / MIB, 1), pssMiB=round(m.pss / MIB, 1))


def _unsupported_network(network: SandboxNetwork | SandboxNetworkUpdate | None) -> None:
    extra = network.model_extra if network else None
    unsupported = sorted(k for k, v in (extra or {}).items() if v not in (None, [], {}, False))
    if unsupported:
        raise Unsupported(f"network.{unsupported[0]} is not supported yet")


def _unsupported_options(body: NewSandbox) -> None:
    # `mcp` needs nothing here: as against E2B, the SDK itself starts the template's
    # `mcp-gateway` in the new sandbox (and kills it if that fails).
    _unsupported_network(body.network)


def _placed_id(request: Request) -> str | None:
    """The id a cluster gateway bound this create to, if it came through one."""
    sid = request.headers.get(wire.SANDBOX_ID_HEADER)
    if sid is None:
        return None
    if not from_cluster(request):
        raise ApiError(403, f"{wire.SANDBOX_ID_HEADER} is for cluster gateways only")
    if not wire.SANDBOX_ID_RE.match(sid):
        raise ApiError(400, f"invalid {wire.SANDBOX_ID_HEADER}")
    return sid


async def _create(request: Request, body: NewSandbox, default_timeout: int) -> Sandbox:
    _unsupported_options(body)
    net = body.network or SandboxNetwork()
    req = CreateRequest(
        template=body.templateID,
        timeout_s=body.timeout if body.timeout is not None else default_timeout,
        metadata=body.metadata or {},
        env_vars=body.envVars or {},
        secure=body.secure is not False,
        auto_pause=bool(body.autoPause),
        auto_resume=bool(body.autoResume and body.autoResume.enabled),
        auto_pause_memory=body.autoPauseMemory is not False,
        allow_internet=body.allow_internet_access,
        allow_out=list(net.allowOut or []),
        deny_out=list(net.denyOut or []),
        dns_servers=net.dnsServers,
        egress_proxy=net.egressProxy,
        rules=net.rules,
        allow_public_traffic=net.allowPublicTraffic,
        mask_request_host=net.maskRequestHost,
        https_ports=net.httpsPorts,
        vcpus=body.cpuCount,
        memory_mib=body.memoryMB,
        sandbox_id=_placed_id(request),
        existing_only=request.headers.get(wire.EXISTING_HEADER) == "1",
        volume_mounts=list(body.volumeMounts or []),
        team_id=team_of(request),
    )
    orch = _orch(request)
    key = request.headers.get("idempotency-key")
    if key is None or req.sandbox_id is not None:  # a gateway's create: the gateway's key
        rec = await orch.create(req)
        claim = None
    else:
        claim, first = await orch.create_keys.claim(
            req.team_id, key, body.model_dump_json(exclude_unset=True).encode())
        req.sandbox_id, req.existing_only = claim.sandbox_id, not first
        try:
            rec = await orch.create(req)
        except BaseException:
            if first:
                orch.create_keys.ended(req.team_id, key, claim, ok=False)
            raise
        if first:
            orch.create_keys.ended(req.team_id, key, claim, ok=True)
    if await request.is_disconnected():  # nobody will learn its id (orchestrator/orphans.py)
        if claim is None and key is not None:  # a gateway's keyed create: its retry may come
            claim = Claim(rec.sandbox_id, "")  # through another gateway (the key in etcd)
        orch.orphans.left(rec.sandbox_id, claim)
    else:
        orch.orphans.taken(rec.sandbox_id)
    return _sandbox(request, rec)


@router.post("/v2/sandboxes", operation_id="createSandboxV2",
             status_code=201, response_model_exclude_unset=True)
async def create_sandbox_v2(request: Request, body: NewSandbox) -> Sandbox:
    """Create a sandbox (timeout defaults to 300 s); it is always secured."""
    body.secure = None
    return await _create(request, body, V2_CREATE_TIMEOUT_S)


@router.post("/sandboxes", operation_id="createSandbox",
             status_code=201, response_model_exclude_unset=True)
async def create_sandbox_v1(request: Request, body: NewSandbox) -> Sandbox:
    """Create a sandbox, v1 (timeout defaults to 15 s; `secure: false` omits the token)."""
    return await _create(request, body, V1_CREATE_TIMEOUT_S)


@router.get("/sandboxes", operation_id="listRunningSandboxes")
async def list_running(
    request: Request,
    metadata: Annotated[str | None, Query(description="double-encoded key=value&...")] = None,
) -> list[ListedSandbox]:
    """v1 list: running sandboxes."""
    q = ListQuery(
        states=states_for_public("running"),
        metadata=query.parse_metadata_filter(metadata),
        limit=1_000_000,
        team_id=team_of(request),
    )
    recs, _ = _orch(request).list(q)
    return [ListedSandbox(**_listed_fields(request, r)) for r in recs]


@router.get("/v2/sandboxes", operation_id="listSandboxes")
async def list_sandboxes(
    request: Request,
    response: Response,
    metadata: Annotated[str | None, Query(description="double-encoded key=value&...")] = None,
    state: Annotated[list[str] | None, Query(description="running,paused (default both)")] = None,
    startedAfter: Annotated[str | None, Query(description="RFC 3339, inclusive")] = None,
    template: Annotated[str | None, Query(description="template id or alias")] = None,
    order: Annotated[str | None, Query(description="asc or desc (default)")] = None,
    limit: Annotated[int | None, Query(ge=1, le=MAX_PAGE)] = None,
    nextToken: Annotated[str | None, Query()] = None,
) -> list[ListedSandbox]:
    """List sandboxes newest first; `x-next-token` is set only when another page exists."""
    if order not in (None, "asc", "desc"):
        raise ApiError(400, "order must be asc or desc")
    q = ListQuery(
        states=query.parse_states(",".join(state) if state else None),
        metadata=query.parse_metadata_filter(metadata),
        started_after_us=(
            query.parse_time_us(startedAfter, "startedAfter") if startedAfter else None
        ),
        template=template and _template_filter(request, template),
        order="asc" if order == "asc" else "desc",
        limit=limit or MAX_PAGE,
        cursor=query.decode_cursor(nextToken),
        team_id=team_of(request),
    )
    recs, nxt = _orch(request).list(q)
    if nxt is not None:
        response.headers["x-next-token"] = query.encode_cursor(nxt)
    query.cluster_cursors(request, response, [(r.started_at_us, r.sandbox_id) for r in recs])
    return [ListedSandbox(**_listed_fields(request, r)) for r in recs]


@router.get("/sandboxes/{sandbox_id}", operation_id="getSandbox", response_model_exclude_unset=True)
async def get_sandbox(request: Request, sandbox_id: str) -> SandboxDetail:
    rec = _orch(request).get(sandbox_id)
    return _detail(request, rec, await _host_memory(request, rec))


@router.delete("/sandboxes/{sandbox_id}", operation_id="killSandbox",
               status_code=204, response_class=Response)
async def kill_sandbox(request: Request, sandbox_id: str) -> Response:
    await _orch(request).kill(sandbox_id)
    return Response(status_code=204)


@router.put("/sandboxes/{sandbox_id}/network", operation_id="updateSandboxNetwork",
            status_code=204, response_class=Response)
async def update_network(request: Request, sandbox_id: str, body: SandboxNetworkUpdate
                         ) -> Response:  # fmt: skip
    """Replace the egress policy of a running or paused sandbox (E2B: omitted fields are
    cleared). Running: applied at once, open connections included; paused: at resume."""
    _unsupported_network(body)
    await _orch(request).update_network(
        sandbox_id, body.allow_internet_access, body.allowOut or [], body.denyOut or [],
        body.dnsServers, body.egressProxy, body.rules)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/timeout", operation_id="setSandboxTimeout",
             status_code=204, response_class=Response)
async def set_timeout(request: Request, sandbox_id: str, body: SandboxTimeout) -> Response:
    """endAt = now + timeout (may shorten it)."""
    await _orch(request).set_timeout(sandbox_id, body.timeout)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/refreshes", operation_id="refreshSandbox",
             status_code=204, response_class=Response)
async def refresh(
    request: Request, sandbox_id: str, body: Annotated[SandboxRefresh | None, Body()] = None
) -> Response:
    """Keep alive `duration` more seconds (extend-only; default the sandbox's timeout)."""
    await _orch(request).refresh(sandbox_id, body.duration if body else None)
    return Response(status_code=204)


async def _connect(
    request: Request, response: Response, sandbox_id: str, body: ConnectSandbox | None
) -> Sandbox:
    timeout = body.timeout if body and body.timeout is not None else CONNECT_TIMEOUT_S
    memory = not (body and body.memory is False)
    await take_over_if_moved(request, sandbox_id)
    rec, resumed = await _orch(request).connect(sandbox_id, timeout, memory)
    response.status_code = 201 if resumed else 200
    return _sandbox(request, rec)


@router.post(
    "/v2/sandboxes/{sandbox_id}/connect", operation_id="connectSandboxV2",
    response_model_exclude_unset=True,
    responses={201: {"model": Sandbox, "description": "resumed"}},
)
@router.post(
    "/sandboxes/{sandbox_id}/connect", operation_id="connectSandbox",
    response_model_exclude_unset=True,
    responses={201: {"model": Sandbox, "description": "resumed"}},
)
async def connect(
    request: Request,
    response: Response,
    sandbox_id: str,
    body: Annotated[ConnectSandbox | None, Body()] = None,
) -> Sandbox:
    """Running: extend-only TTL, 200. Paused: resume, 201 (`memory: false`: by reboot, the
    memory state discarded). (v1 and v2 share it.)"""
    return await _connect(request, response, sandbox_id, body)


@router.post("/sandboxes/{sandbox_id}/pause", operation_id="pauseSandbox",
             status_code=204, response_class=Response,
             responses={409: {"model": Error, "description": "already paused"},
                        503: {"model": Error, "description": "guest unresponsive (strict)"}})
async def pause_sandbox(
    request: Request, sandbox_id: str,
    body: Annotated[SandboxPauseRequest | None, Body()] = None,
) -> Response:
    """Pause: processes, memory and files are kept on disk; no CPU, RAM or slot is held.
    `memory: false`: filesystem-only, only the disk is kept and resuming reboots it.
    `requireHealthyGuest: true`: 503 (still running) if the guest's agent does not answer."""
    await _orch(request).pause(
        sandbox_id,
        memory=not (body and body.memory is False),
        require_healthy_guest=bool(body and body.requireHealthyGuest),
    )
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/resume", operation_id="resumeSandbox", status_code=201,
             response_model_exclude_unset=True)
async def resume_sandbox(
    request: Request, sandbox_id: str, body: Annotated[ResumedSandbox | None, Body()] = None,
) -> Sandbox:
    """v1 resume: paused -> running with endAt = now + timeout (default 15 s); 409 if it is
    running."""
    timeout = body.timeout if body and body.timeout is not None else V1_RESUME_TIMEOUT_S
    await take_over_if_moved(request, sandbox_id)
    rec = await _orch(request).resume(sandbox_id, timeout, body.autoPause if body else None)
    return _sandbox(request, rec)


@router.post("/sandboxes/{sandbox_id}/fork", operation_id="forkSandbox", status_code=201,
             responses={201: {"model": list[SandboxForkResult]}})
async def fork_sandbox(
    request: Request, sandbox_id: str,
    body: Annotated[SandboxForkRequest | None, Body()] = None,
) -> JSONResponse:
    """Fork a sandbox into `count` children (default 1, at most 20). A running source keeps
    running; a paused one (aenv: E2B refuses it) is forked from its paused state and stays
    paused. One `{sandbox}` or `{error}` per child; children over the node's sandbox limit
    get `{error: {code: 429}}`."""
    count = body.count if body and body.count is not None else 1
    results = await _orch(request).fork(sandbox_id, count, body.timeout if body else None)
    return fork_results(request, results)


def fork_results(request: Request,
                 results: Sequence[SandboxRecord | BaseException | dict[str, object]]
                 ) -> JSONResponse:  # fmt: skip
    """201 with one `{sandbox}` or `{error: {code, message}}` per child."""
    out: list[dict[str, object]] = []
    for r in results:
        if isinstance(r, dict):  # a child another node started, as it answered
            out.append(r)
        elif isinstance(r, BaseException):
            status = int(getattr(r, "status", 500))
            out.append({"error": {"code": status, "message": str(r) or type(r).__name__}})
        else:
            out.append({"sandbox": _sandbox(request, r).model_dump(exclude_unset=True)})
    return JSONResponse(out, status_code=201)

