"""The routes the code interpreter SDKs call, as E2B's server answers them: `/execute` streams
NDJSON (200 at once; what goes wrong later is a line), `/contexts` makes, lists, restarts
and removes contexts; errors are plain text bodies (404 for an unknown context, 400 for a
context and a language at once, 500 for a context that cannot be made), bad bodies 422."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from aenv.interpreter import execution
from aenv.interpreter.contexts import ContextError, ContextNotFound, Contexts
from aenv.interpreter.languages import DEFAULT_CWD

log = logging.getLogger("aenv.interpreter")

ENVS_URL = "http://127.0.0.1:49983/envs"  # the agent's: the sandbox's env vars


@dataclass(frozen=True)
class Settings:
    languages: Sequence[str] = ("python",)  # default contexts made before it is healthy
    envs_url: str = ENVS_URL
    cwd: str = DEFAULT_CWD  # contexts' directory unless a create names one
    ipython_dir: Path | None = None  # the kernels' IPython profile (None: ~/.ipython)
    state_dir: Path | None = None  # where it writes kernel specs (None: contexts.STATE_DIR)
    # Run silently in the default python context before it is healthy: a template snapshots
    # it with its heavy libraries imported, so a first `import pandas` costs nothing.
    preload: str = ""


class _Bad(Exception):
    """A body that is not what the route takes (422)."""


async def _body(request: Request, fields: dict[str, type]) -> dict[str, Any]:
    """The JSON body's `fields` (each of its type or null); anything else is a 422."""
    raw = await request.body()
    try:
        doc = json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise _Bad("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise _Bad("the body is not a JSON object")
    out: dict[str, Any] = {}
    for name, kind in fields.items():
        value = doc.get(name)
        if value is not None and not isinstance(value, kind):
            raise _Bad(f"{name}: not a {kind.__name__}")
        out[name] = value
    return out


def _unprocessable(e: _Bad) -> JSONResponse:
    return JSONResponse({"detail": [{"msg": str(e)}]}, status_code=422)


def _fetch_envs(url: str, token: str | None) -> dict[str, str]:
    req = urllib.request.Request(url, headers={"X-Access-Token": token} if token else {})
    with urllib.request.urlopen(req, timeout=5) as r:
        doc = json.loads(r.read())
    return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


def make_app(settings: Settings | None = None) -> Starlette:
    settings = settings or Settings()
    contexts = Contexts(settings.cwd, settings.ipython_dir, settings.state_dir)
    ready = asyncio.Event()

    async def globals_(token: str | None) -> dict[str, str] | None:
        try:
            return await asyncio.to_thread(_fetch_envs, settings.envs_url, token)
        except (OSError, ValueError) as e:  # unreachable, or refused: asked again next run
            log.warning("the sandbox's env vars from %s: %s", settings.envs_url, e)
            return None

    async def health(request: Request) -> Response:
        if not ready.is_set():
            return PlainTextResponse("starting", status_code=503)
        return JSONResponse("OK")

    async def execute(request: Request) -> Response:
        try:
            body = await _body(request, {"code": str, "context_id": str, "language": str,
                                         "env_vars": dict})  # fmt: skip
            if body["code"] is None:
                raise _Bad("code: required")
            envs = body["env_vars"] or {}
            if not all(isinstance(v, str) for v in envs.values()):
                raise _Bad("env_vars: values must be strings")
        except _Bad as e:
            return _unprocessable(e)
        if body["context_id"] and body["language"]:
            return PlainTextResponse("Only one of context_id or language can be provided",
                                     status_code=400)  # fmt: skip
        try:
            if body["language"]:
                ctx = await contexts.default(body["language"])
            elif body["context_id"]:
                ctx = contexts.get(body["context_id"])
            else:
                ctx = await contexts.default("python")
        except ContextNotFound as e:
            return PlainTextResponse(str(e), status_code=404)
        except ContextError as e:
            return PlainTextResponse(str(e), status_code=500)
        token = request.headers.get("x-access-token")

        async def ndjson() -> AsyncIterator[bytes]:
            async for line in execution.execute(ctx, body["code"], envs, token, globals_):
                yield (json.dumps(line) + "\n").encode()

        return StreamingResponse(ndjson(), media_type="application/x-ndjson")

    async def create_context(request: Request) -> Response:
        try:
            body = await _body(request, {"language": str, "cwd": str})
        except _Bad as e:
            return _unprocessable(e)
        try:
            ctx = await contexts.create(body["language"], body["cwd"])
        except ContextError as e:
            return PlainTextResponse(str(e), status_code=500)
        return JSONResponse(ctx.info())

    async def list_contexts(request: Request) -> Response:
        return JSONResponse([c.info() for c in contexts.list()])

    async def restart_context(request: Request) -> Response:
        return await _change(contexts.restart, request.path_params["context_id"])

    async def remove_context(request: Request) -> Response:
        return await _change(contexts.remove, request.path_params["context_id"])

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for language in settings.languages:
            ctx = await contexts.default(language)  # a failure stops the server: not healthy
            if ctx.language == "python" and settings.preload:
                await execution.silently(ctx, settings.preload)
        ready.set()
        try:
            yield
        finally:
            await contexts.close()

    return Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/execute", execute, methods=["POST"]),
        Route("/contexts", create_context, methods=["POST"]),
        Route("/contexts", list_contexts, methods=["GET"]),
        Route("/contexts/{context_id}/restart", restart_context, methods=["POST"]),
        Route("/contexts/{context_id}", remove_context, methods=["DELETE"]),
    ], lifespan=lifespan)  # fmt: skip


async def _change(action: Any, context_id: str) -> Response:
    try:
        await action(context_id)
    except ContextNotFound as e:
        return PlainTextResponse(str(e), status_code=404)
    except ContextError as e:
        return PlainTextResponse(str(e), status_code=500)
    return JSONResponse(None)
