"""The admin API: teams, their limits and their keys (an admin key only; docs/api.md).

Not part of E2B's API, whose teams live in its dashboard: aenv's operators manage them here
or with `aenv team` and `aenv key`. A key is shown once, in the answer that creates it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from aenv.api import query
from aenv.api.apierror import ApiError
from aenv.api.auth import require_admin
from aenv.api.models import Error
from aenv.orchestrator.states import HOLDS_CAPACITY
from aenv.teams.model import ApiKey, Team, TeamError
from aenv.teams.store import Teams

T = TypeVar("T")
router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)],
                   responses={s: {"model": Error} for s in (400, 401, 403, 404, 409)})  # fmt: skip


class NewTeam(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: StrictStr
    maxSandboxes: StrictInt | None = None
    maxMemoryMB: StrictInt | None = None
    # What its creates and builds may pull, in place of the node's `image_registries`.
    imageRegistries: list[StrictStr] | None = None


class TeamLimits(BaseModel):
    """Only the fields given change; null means no limit (imageRegistries: the node's)."""

    model_config = ConfigDict(extra="forbid")
    maxSandboxes: StrictInt | None = None
    maxMemoryMB: StrictInt | None = None
    imageRegistries: list[StrictStr] | None = None


class TeamUsage(BaseModel):
    sandboxes: int
    memoryMB: int


class TeamOut(BaseModel):
    teamID: str
    name: str
    maxSandboxes: int | None
    maxMemoryMB: int | None
    imageRegistries: list[str] | None  # null: the node's image_registries
    createdAt: str
    usage: TeamUsage


class NewKey(BaseModel):
    model_config = ConfigDict(extra="forbid")
    team: StrictStr  # id or name
    name: StrictStr = ""
    admin: StrictBool = False


class KeyOut(BaseModel):
    keyID: str
    teamID: str
    name: str
    mask: str
    admin: bool
    createdAt: str
    revokedAt: str | None


class CreatedKey(KeyOut):
    key: str  # shown this once: only its hash is kept


def _teams(request: Request) -> Teams:
    teams: Teams | None = request.app.state.orchestrator.teams
    assert teams is not None  # routes run between start and close
    return teams


async def _call(fn: Callable[..., T | Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    try:
        out = fn(*args, **kwargs)
        return await out if inspect.isawaitable(out) else out  # type: ignore[return-value]
    except TeamError as e:
        raise ApiError(e.status, str(e)) from None


def _team(request: Request, t: Team) -> TeamOut:
    store = request.app.state.orchestrator.store
    usage = TeamUsage(sandboxes=store.count(HOLDS_CAPACITY, t.team_id),
                      memoryMB=store.sum_memory_mib(HOLDS_CAPACITY, t.team_id))  # fmt: skip
    return TeamOut(teamID=t.team_id, name=t.name, maxSandboxes=t.max_sandboxes,
                   maxMemoryMB=t.max_memory_mib, createdAt=query.rfc3339(t.created_us),
                   imageRegistries=None if t.image_registries is None else
                   list(t.image_registries), usage=usage)  # fmt: skip


def _key(k: ApiKey) -> dict[str, Any]:
    return {"keyID": k.key_id, "teamID": k.team_id, "name": k.name, "mask": k.mask,
            "admin": k.admin, "createdAt": query.rfc3339(k.created_us),
            "revokedAt": None if k.revoked_us is None else query.rfc3339(k.revoked_us)}


@router.get("/teams", operation_id="adminListTeams")
async def list_teams(request: Request) -> list[TeamOut]:
    return [_team(request, t) for t in _teams(request).teams()]


@router.post("/teams", operation_id="adminCreateTeam", status_code=201)
async def create_team(request: Request, body: NewTeam) -> TeamOut:
    t = await _call(_teams(request).create_team, body.name, body.maxSandboxes, body.maxMemoryMB,
                    body.imageRegistries)  # fmt: skip
    return _team(request, t)


@router.get("/teams/{team}", operation_id="adminGetTeam")
async def get_team(request: Request, team: str) -> TeamOut:
    return _team(request, await _call(_teams(request).team, team))


@router.patch("/teams/{team}", operation_id="adminSetTeamLimits")
async def set_limits(request: Request, team: str, body: TeamLimits) -> TeamOut:
    names = {"maxSandboxes": "max_sandboxes", "maxMemoryMB": "max_memory_mib",
             "imageRegistries": "image_registries"}  # fmt: skip
    changes = {names[f]: getattr(body, f) for f in body.model_fields_set}
    return _team(request, await _call(_teams(request).set_limits, team, **changes))


@router.delete("/teams/{team}", operation_id="adminDeleteTeam", status_code=204)
async def delete_team(request: Request, team: str) -> Response:
    orch = request.app.state.orchestrator
    t = await _call(_teams(request).team, team)
    owned = await orch.owned_by(t.team_id)
    if owned:
        raise ApiError(409, f"team {t.name!r} still owns {', '.join(owned)}: remove them first")
    await _call(_teams(request).delete_team, t.team_id)
    return Response(status_code=204)


@router.get("/keys", operation_id="adminListKeys")
async def list_keys(request: Request,
                    team: Annotated[str | None, Query(description="a team's id or name")] = None,
                    ) -> list[KeyOut]:  # fmt: skip
    return [KeyOut(**_key(k)) for k in await _call(_teams(request).keys, team)]


@router.post("/keys", operation_id="adminCreateKey", status_code=201)
async def create_key(request: Request, body: NewKey) -> CreatedKey:
    k, secret = await _call(_teams(request).create_key, body.team, body.name, body.admin)
    return CreatedKey(**_key(k), key=secret)


@router.delete("/keys/{key_id}", operation_id="adminRevokeKey", status_code=204)
async def revoke_key(request: Request, key_id: str) -> Response:
    await _call(_teams(request).revoke, key_id)
    return Response(status_code=204)
