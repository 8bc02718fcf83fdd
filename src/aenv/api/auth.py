"""Control-plane auth: an API key sent as `X-API-Key`, looked up (by its hash) among the
teams' keys (teams/store.py). The request then acts for the key's team (`principal`).

The node's own key is `config.api_key` (`AENV_API_KEY`) if set, else the contents of
`<data_dir>/api_key`, which is generated (mode 0600) on first start: the admin key of the
`default` team. No key is ever logged.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path

from fastapi import Request, Security
from fastapi.security import APIKeyHeader

from aenv.api.apierror import ApiError
from aenv.config import Config
from aenv.teams.model import DEFAULT_TEAM, NODE_KEY_ID, Principal
from aenv.teams.store import Teams

log = logging.getLogger("aenv.api")

API_KEY_HEADER = "X-API-Key"
_scheme = APIKeyHeader(name=API_KEY_HEADER, auto_error=False)


def api_key_path(config: Config) -> Path:
    return config.data_dir / "api_key"


def resolve_api_key(config: Config) -> str:
    if config.api_key:
        return config.api_key
    path = api_key_path(config)
    try:
        key = path.read_text().strip()
        if key:
            return key
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = "aenv_" + secrets.token_hex(20)
    tmp = path.with_name(f".api_key.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (key + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    log.info("api_key.generated", extra={"kv": {"path": str(path)}})
    return key


def principal_of(request: Request) -> Principal | None:
    """The team and key a request's `X-API-Key` belongs to; None for no key, an unknown one
    or a revoked one."""
    given = request.headers.get(API_KEY_HEADER)
    if not given:
        return None
    teams: Teams | None = request.app.state.orchestrator.teams
    if teams is None:  # not started: only the node's own key
        expected: str = request.app.state.api_key
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return None
        return Principal(DEFAULT_TEAM, NODE_KEY_ID, admin=True)
    return teams.principal(given)


async def require_api_key(request: Request, _key: str | None = Security(_scheme)) -> None:
    who = principal_of(request)
    if who is None:
        raise ApiError(401, "Invalid API key")
    request.state.principal = who
    # Another team's sandbox is answered as one that does not exist, by every route that
    # names one (the routes then 404 on their own for one that does not).
    sid = request.path_params.get("sandbox_id")
    if sid is not None:
        rec = request.app.state.orchestrator.store.get(sid)
        if rec is not None and rec.team_id != who.team_id:
            raise ApiError(404, f"sandbox \"{sid}\" doesn't exist or you don't have access "
                           "to it")  # fmt: skip


def principal(request: Request) -> Principal:
    """Who is asking (set by `require_api_key`, which every control-plane route runs)."""
    who: Principal = request.state.principal
    return who


def team_of(request: Request) -> str:
    return principal(request).team_id


async def require_admin(request: Request, _key: str | None = Security(_scheme)) -> None:
    await require_api_key(request)
    if not principal(request).admin:
        raise ApiError(403, "this API key is not an admin key: teams and keys are managed "
                       "with an admin key")  # fmt: skip
