"""E2B's secrets API (`e2b.Secret`): create, list (paged by `x-next-token`), read, a new
version, delete. Values are write-only: no route ever returns one (secrets/store.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel, ConfigDict, StrictStr

from aenv.api import query
from aenv.api.apierror import ApiError
from aenv.api.auth import require_api_key, team_of
from aenv.api.models import Error
from aenv.secrets.store import MAX_LIMIT, SecretError, SecretInfo, Secrets

router = APIRouter(
    dependencies=[Depends(require_api_key)],
    responses={s: {"model": Error} for s in (400, 401, 404, 409)},
)
NEXT_TOKEN_HEADER = "x-next-token"


class NewSecret(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: StrictStr
    value: StrictStr
    metadata: dict[str, Any] | None = None  # checked in secrets/store.py


class SecretUpdate(BaseModel):
    model_config = ConfigDict(extra="ignore")
    value: StrictStr
    metadata: dict[str, Any] | None = None


class Secret(BaseModel):
    secretID: str
    name: str
    currentVersion: int
    metadata: dict[str, str]
    createdAt: str
    updatedAt: str


def _store(request: Request) -> Secrets:
    store: Secrets | None = request.app.state.orchestrator.secrets
    assert store is not None  # routes run between start and close
    return store


def _out(s: SecretInfo) -> Secret:
    return Secret(secretID=s.secret_id, name=s.name, currentVersion=s.version,
                  metadata=s.metadata, createdAt=query.rfc3339(s.created_us),
                  updatedAt=query.rfc3339(s.updated_us))  # fmt: skip


async def _call(fn: Any, *args: Any) -> Any:
    try:
        return await fn(*args)
    except SecretError as e:
        raise ApiError(e.status, str(e)) from None


@router.post("/secrets", operation_id="createSecret", status_code=201)
async def create_secret(request: Request, body: NewSecret) -> Secret:
    return _out(await _call(_store(request).create, team_of(request), body.name, body.value,
                            body.metadata))


@router.get("/secrets", operation_id="listSecrets")
async def list_secrets(
    request: Request, response: Response,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = MAX_LIMIT,
    nextToken: Annotated[str | None, Query()] = None,  # E2B's query key
) -> list[Secret]:
    items, nxt = await _call(_store(request).page, team_of(request), limit, nextToken)
    if nxt is not None:
        response.headers[NEXT_TOKEN_HEADER] = nxt
    return [_out(s) for s in items]


@router.get("/secrets/{secret_id}", operation_id="getSecret")
async def get_secret(request: Request, secret_id: str) -> Secret:
    return _out(await _call(_store(request).get, team_of(request), secret_id))


@router.post("/secrets/{secret_id}", operation_id="updateSecret")
async def update_secret(request: Request, secret_id: str, body: SecretUpdate) -> Secret:
    """A new version, current from now on; `metadata`, if given, replaces the old."""
    return _out(await _call(_store(request).update, team_of(request), secret_id, body.value,
                            body.metadata))


@router.delete("/secrets/{secret_id}", operation_id="deleteSecret", status_code=204,
               response_class=Response)
async def delete_secret(request: Request, secret_id: str) -> Response:
    await _call(_store(request).delete, team_of(request), secret_id)
    return Response(status_code=204)
