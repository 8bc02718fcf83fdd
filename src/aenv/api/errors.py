"""One table from exceptions to E2B error bodies `{"code": <status>, "message": "..."}`,
plus E2B's optional machine-readable `"error_code"` where an error class names one."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from aenv.api import volumes
from aenv.api.apierror import ApiError
from aenv.api.auth import principal_of
from aenv.machines.api import RuntimeError_
from aenv.orchestrator.errors import CapacityExhausted, OrchestratorError, TeamLimitReached
from aenv.orchestrator.pending import TemplateNotReady

log = logging.getLogger("aenv.api")


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None,
    error_code: str | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"code": status, "message": message}
    if error_code:
        body["error_code"] = error_code
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "invalid request"
    err = errors[0]
    if err.get("type") == "json_invalid":
        return "request body is not valid JSON"
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path", "header")]
    where = ".".join(loc)
    if not where and err.get("type") == "missing":
        return "request body is required"
    msg = str(err.get("msg", "invalid value"))
    return f"{where}: {msg}" if where else msg


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.headers)

    @app.exception_handler(OrchestratorError)
    async def _orch_error(request: Request, exc: OrchestratorError) -> JSONResponse:
        headers = None
        if isinstance(exc, CapacityExhausted | TemplateNotReady):
            headers = {"Retry-After": str(exc.retry_after_s)}
        elif isinstance(exc, TeamLimitReached):
            headers = {"Should-Retry": "false"}  # waiting does not help: fail fast
        if exc.status >= 500:
            log.warning("api.error", extra={"kv": {"status": exc.status, "error": exc.message}})
        return error_response(exc.status, exc.message, headers)

    @app.exception_handler(RuntimeError_)
    async def _runtime_error(request: Request, exc: RuntimeError_) -> JSONResponse:
        status = int(getattr(exc, "status", 500))
        headers = {"Retry-After": "1"} if status == 429 else None
        # A traceback only for what nobody planned: a declared status (e.g. 503 for a guest
        # that does not answer) is the guest's state, not a node bug.
        if status >= 500:
            planned = status != 500
            log.log(logging.WARNING if planned else logging.ERROR, "api.runtime_error",
                    exc_info=None if planned else exc,
                    extra={"kv": {"path": loggable(request.url.path), "status": status,
                                  "error": str(exc)}})  # fmt: skip
        return error_response(status, str(exc) or type(exc).__name__, headers,
                              getattr(exc, "error_code", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # The body is parsed before dependencies run: answer 401 first for a bad key.
        if request.url.path.startswith(volumes.CONTENT_PREFIX):
            if not volumes.content_auth_ok(request):
                return error_response(401, "invalid or missing volume token")
        elif principal_of(request) is None:
            return error_response(401, "Invalid API key")
        return error_response(400, _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route for {request.method} {request.url.path}"
        return error_response(exc.status_code, message, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("api.internal_error", exc_info=exc,
                  extra={"kv": {"path": loggable(request.url.path)}})
        return error_response(500, "internal server error")


def loggable(path: str) -> str:
    """The path as logs may show it: a run-code token in it is a credential."""
    head, sep, _ = path.partition("/rl/run_code/")
    return head + sep + "…" if sep else path


def body(status: int, message: str) -> dict[str, Any]:
    return {"code": status, "message": message}
