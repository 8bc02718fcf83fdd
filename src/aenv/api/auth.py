"""Control-plane auth: one API key per node, sent as `X-API-Key`, compared in constant time.

The key is `config.api_key` (`AENV_API_KEY`) if set, else the contents of `<data_dir>/api_key`,
which is generated (mode 0600) on first start. It is never logged.
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


def key_ok(request: Request) -> bool:
    expected: str = request.app.state.api_key
    given = request.headers.get(API_KEY_HEADER)
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


async def require_api_key(request: Request, _key: str | None = Security(_scheme)) -> None:
    if not key_ok(request):
        raise ApiError(401, "Invalid API key")
