"""The RL plane's routes (`/rl/...`, aenv's extension; docs/rl.md): groups joined by key,
leases, group-wide operations and reward in a throwaway fork. Same API keys, teams and
error bodies as the E2B routes."""

from __future__ import annotations

import contextlib
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request, Response
from fastapi.responses import JSONResponse

from aenv.api.apierror import ApiError
from aenv.api.auth import principal, require_api_key, team_of
from aenv.api.models import Error
from aenv.api.sandboxes import fork_results
from aenv.orchestrator.errors import CapacityExhausted, NotFound
from aenv.rl.server.leases import Lease
from aenv.rl.server.models import (
    CheckpointFork,
    CheckpointNew,
    Command,
    Evaluate,
    GroupJoin,
    LeaseNew,
    LeaseSandbox,
    RollbackTo,
)
from aenv.rl.server.run_code import GROUP_KEY, LANGUAGES, RunCodeRequest
from aenv.rl.server.service import RL

RESERVED_KEY_PREFIX = GROUP_KEY.partition("/")[0] + "/"  # the node's own groups

router = APIRouter(
    prefix="/rl", tags=["rl"], dependencies=[Depends(require_api_key)],
    responses={s: {"model": Error} for s in (400, 401, 404, 409, 429, 500, 503)},
)  # fmt: skip


def _rl(request: Request) -> RL:
    return request.app.state.rl


def _lease(rl: RL, lease: Lease) -> dict[str, Any]:
    return lease.to_json(rl.leases.clock())


@router.post("/groups", operation_id="rlJoinGroup", status_code=201)
async def join_group(request: Request, body: GroupJoin) -> dict[str, Any]:
    """The next member of the group of `key`, a fork of its start state. The first call
    with a key makes the group (its `source`, `setup` once, a snapshot; `n` members forked
    ahead) under a new lease (`lease_s`, default 300) or `leaseID`; concurrent first calls
    wait on one start. Connect to the member with the E2B SDK (`Sandbox.connect(id)`)."""
    if body.key.startswith(RESERVED_KEY_PREFIX):
        raise ApiError(400, f"group keys starting {RESERVED_KEY_PREFIX!r} are reserved")
    rl = _rl(request)
    g, m, made = await rl.groups.join(team_of(request), body)
    return {"groupID": g.group_id, "key": g.key, "created": made,
            "member": {"sandboxID": m.sandbox_id, "index": m.index},
            "startSnapshotID": g.start_snapshot, "lease": _lease(rl, g.lease)}


@router.get("/groups/{group_id}", operation_id="rlGetGroup")
async def get_group(request: Request, group_id: str) -> dict[str, Any]:
    """The group, its members and their states (`gone`: its sandbox no longer exists)."""
    rl = _rl(request)
    return rl.groups.view(rl.groups.get(group_id, team_of(request)))


@router.post("/groups/{group_id}/exec", operation_id="rlExecGroup")
async def exec_group(request: Request, group_id: str, body: Command) -> list[dict[str, Any]]:
    """Run one command on every running member (8 at a time): per member `exitCode`,
    `stdout`, `stderr`, or `error` (not running, timed out, its VMM died)."""
    rl = _rl(request)
    return await rl.groups.exec_all(rl.groups.get(group_id, team_of(request)), body)


@router.post("/groups/{group_id}/pause", operation_id="rlPauseGroup")
async def pause_group(request: Request, group_id: str) -> list[dict[str, Any]]:
    rl = _rl(request)
    return await rl.groups.each(rl.groups.get(group_id, team_of(request)), "pause")


@router.post("/groups/{group_id}/resume", operation_id="rlResumeGroup")
async def resume_group(request: Request, group_id: str) -> list[dict[str, Any]]:
    rl = _rl(request)
    return await rl.groups.each(rl.groups.get(group_id, team_of(request)), "resume")


@router.post("/groups/{group_id}/replace_failed", operation_id="rlReplaceFailed")
async def replace_failed(request: Request, group_id: str) -> dict[str, Any]:
    """Members whose sandbox is gone (VMM died, killed) get a new fork in their place."""
    rl = _rl(request)
    g = rl.groups.get(group_id, team_of(request))
    replaced = await rl.groups.replace_failed(g)
    return {"replaced": replaced, "group": rl.groups.view(g)}


@router.delete("/groups/{group_id}", operation_id="rlEndGroup", status_code=204)
async def end_group(request: Request, group_id: str) -> Response:
    """Kill every member and delete the start state made for the group."""
    rl = _rl(request)
    await rl.groups.end(rl.groups.get(group_id, team_of(request)))
    return Response(status_code=204)


@router.post("/leases", operation_id="rlNewLease", status_code=201)
async def new_lease(request: Request, body: LeaseNew) -> dict[str, Any]:
    """A lease of `lease_s` seconds: what it holds ends `lease_s` after its last renewal
    (within 5 s more)."""
    rl = _rl(request)
    return _lease(rl, rl.leases.new(team_of(request), body.lease_s))


@router.get("/leases/{lease_id}", operation_id="rlGetLease")
async def get_lease(request: Request, lease_id: str) -> dict[str, Any]:
    rl = _rl(request)
    return _lease(rl, rl.leases.get(lease_id, team_of(request)))


@router.post("/leases/{lease_id}", operation_id="rlRenewLease")
async def renew_lease(request: Request, lease_id: str) -> dict[str, Any]:
    """Renew: the lease ends `lease_s` from now; its sandboxes' timeouts move past that."""
    rl = _rl(request)
    return _lease(rl, rl.renew(lease_id, team_of(request)))


@router.post("/leases/{lease_id}/sandboxes", operation_id="rlLeaseSandbox")
async def lease_sandbox(request: Request, lease_id: str, body: LeaseSandbox) -> dict[str, Any]:
    """The lease holds `sandboxID` too (one the caller made): it ends with the lease."""
    rl = _rl(request)
    return _lease(rl, rl.adopt(lease_id, team_of(request), body.sandbox_id))


@router.delete("/leases/{lease_id}", operation_id="rlReleaseLease", status_code=204)
async def release_lease(request: Request, lease_id: str) -> Response:
    """End the lease now, and everything it holds."""
    await _rl(request).release(lease_id, team_of(request))
    return Response(status_code=204)


@router.post("/evaluate", operation_id="rlEvaluate")
async def evaluate(request: Request, body: Evaluate) -> dict[str, Any]:
    """Run `cmd` (after writing `files`) in a throwaway fork of `sandboxID` (`base:
    current`; the sandbox itself is stopped only for the fork's snapshot) or in a sandbox
    from `snapshot` (`base: snapshot`). `reward` is the number the command wrote to
    `reward_file`; `status` is `ok`, `error` (no number there, or the agent refused a file
    or the command), `timeout`, or `infra_error` (the platform failed: no reward, never 0)."""
    return await _rl(request).evaluator.evaluate(team_of(request), body)


@router.post("/sandboxes/{sandbox_id}/checkpoints", operation_id="rlCheckpoint",
             status_code=201)  # fmt: skip
async def checkpoint(request: Request, sandbox_id: str,
                     body: Annotated[CheckpointNew | None, Body()] = None) -> dict[str, Any]:
    """A checkpoint of a running sandbox (it stops only while its state is saved): a step
    id to roll back to or fork from. Its parent is the sandbox's last checkpoint (or the one
    it was rolled back to or forked from)."""
    rl = _rl(request)
    c = await rl.checkpoints.take(team_of(request), sandbox_id, body.lease_id if body else None)
    return c.to_json()


@router.get("/sandboxes/{sandbox_id}/checkpoints", operation_id="rlListCheckpoints")
async def list_checkpoints(request: Request, sandbox_id: str) -> list[dict[str, Any]]:
    _rl(request).orch.get(sandbox_id)  # 404 for none (and for another team's)
    return [c.to_json() for c in _rl(request).checkpoints.of_sandbox(sandbox_id)]


@router.post("/sandboxes/{sandbox_id}/rollback", operation_id="rlRollback")
async def rollback(request: Request, sandbox_id: str, body: RollbackTo) -> dict[str, Any]:
    """Put the sandbox back into a checkpoint's state: same id, same token, same timeout
    and network policy. Open streams and terminals end as on a pause; volumes keep their
    data. Its checkpoints stay."""
    return await _rl(request).checkpoints.rollback(team_of(request), sandbox_id, body.step_id)


@router.post("/checkpoints/{step_id}/fork", operation_id="rlForkCheckpoint", status_code=201)
async def fork_checkpoint(request: Request, step_id: str,
                          body: Annotated[CheckpointFork | None, Body()] = None,
                          ) -> JSONResponse:  # fmt: skip
    """`count` new sandboxes in the checkpoint's state (at most 20), its children in the
    tree; a lease (`leaseID`) holds them. The answer is a fork's."""
    b = body or CheckpointFork()
    kids = await _rl(request).checkpoints.fork(team_of(request), step_id, b.count,
                                               b.lease_id, b.timeout)  # fmt: skip
    return fork_results(request, kids)


@router.delete("/checkpoints/{step_id}", operation_id="rlDeleteCheckpoint")
async def delete_checkpoint(request: Request, step_id: str) -> dict[str, Any]:
    """The checkpoint and its subtree: every checkpoint below it, and the live sandboxes
    descending from them (killed)."""
    return await _rl(request).checkpoints.delete(team_of(request), step_id)


@router.get("/lineage/{some_id}", operation_id="rlLineage")
async def lineage(request: Request, some_id: str) -> dict[str, Any]:
    """The tree holding a checkpoint (step id) or a sandbox: its checkpoints (with parent
    links) and the live sandboxes whose head is one of them."""
    return _rl(request).checkpoints.lineage(team_of(request), some_id)


@router.get("/run_code", operation_id="rlRunCodeToken")
async def run_code_token(request: Request) -> dict[str, Any]:
    """A SandboxFusion endpoint for this API key: set a trainer's SandboxFusion URL (verl's
    `reward.sandbox_fusion.url`) to `url`. The token in it is a credential (whoever holds it
    runs code as your team) bound to this key: revoking the key revokes it."""
    token = _rl(request).tokens.make(principal(request).key_id)
    path = f"/rl/run_code/{token}"
    return {"url": str(request.base_url).rstrip("/") + path, "path": path,
            "languages": sorted(LANGUAGES)}


@router.delete("/run_code", operation_id="rlRunCodeEnd", status_code=204)
async def run_code_end(request: Request) -> Response:
    """End the team's run-code sandboxes now (they end on their own 15 minutes after the
    last call); the next call makes them again. Tokens stay valid."""
    rl = _rl(request)
    lid = rl.run_code.lease_id(team_of(request))
    if lid is not None:
        with contextlib.suppress(NotFound):
            await rl.release(lid, team_of(request))
    return Response(status_code=204)


# verl's SandboxFusion client sends no API key: the token in the path is the credential.
public = APIRouter(prefix="/rl", tags=["rl"])


@public.post("/run_code/{token}", operation_id="rlRunCode",
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                 "schema": RunCodeRequest.model_json_schema()}}}},
             responses={401: {"model": Error}, 504: {"model": Error}})  # fmt: skip
async def run_code(request: Request, token: str) -> dict[str, Any]:
    """SandboxFusion's `run_code` (verl's `reward.sandbox_fusion.url`): the program runs in
    a fork of the team's run-code start state, alone, and the answer is SandboxFusion's
    (HTTP 200, `status` Success, Failed or SandboxError). 504 when the node has no room
    now (verl's client tries again)."""
    rl = _rl(request)
    teams = rl.groups.orch.teams
    key_id = rl.tokens.key_id(token)
    key = None
    if key_id is not None and teams is not None:
        with contextlib.suppress(Exception):
            key = teams.key(key_id)
    if key is None or key.revoked_us is not None:
        raise ApiError(401, "invalid run-code token")
    try:
        raw = await request.json()
    except ValueError:
        raw = None
    try:
        return await rl.run_code.run(key.team_id, raw)
    except CapacityExhausted as e:
        raise ApiError(504, f"no room for the program now: {e}") from None
