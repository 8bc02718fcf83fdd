"""Plain HTTP endpoints besides /files: /health, /init, /envs, /metrics."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging

from . import kernel, metrics, mounts
from .asgi import HTTPError, Request, Send, send_json, send_response
from .journal import MAX_PAGE, Journal
from .options import AgentOptions
from .state import SandboxState

log = logging.getLogger("aenv.guest.agent")

MAX_INIT_BODY = 1024 * 1024
MAX_ENTROPY_BYTES = 4096


async def health(req: Request, send: Send) -> None:
    await send_response(send, 204)


async def envs(state: SandboxState, send: Send) -> None:
    await send_json(send, 200, state.env_vars)


async def get_metrics(cpu: metrics.CpuSampler, send: Send) -> None:
    await send_json(send, 200, metrics.collect(cpu))


async def get_logs(journal: Journal, req: Request, send: Send) -> None:
    """The journal's entries after `?after=N` (0: all it keeps), at most `limit`."""
    try:
        after = int(req.query.get("after", "0"))
        limit = min(int(req.query.get("limit", str(MAX_PAGE))), MAX_PAGE)
    except ValueError:
        raise HTTPError(400, "after and limit must be whole numbers") from None
    entries, nxt = journal.since(after, max(limit, 1))
    await send_json(send, 200, {"entries": [e.to_json() for e in entries], "next": nxt})


async def init(state: SandboxState, options: AgentOptions, req: Request, send: Send) -> None:
    """Apply the node's per-sandbox identity (after boot, restore and every fork).

    Order: entropy first (so nothing after it runs on a cloned RNG), then clock, env vars,
    default user/workdir and the access token. Answers 204 only when all of it is applied.
    """
    raw = await req.body(MAX_INIT_BODY)
    try:
        body = json.loads(raw) if raw.strip() else {}
    except (ValueError, UnicodeDecodeError) as e:
        raise HTTPError(400, f"invalid JSON body: {e}") from None
    if not isinstance(body, dict):
        raise HTTPError(400, "the /init body must be a JSON object")

    entropy = body.get("aenvEntropy")
    if entropy:
        try:
            seed = base64.b64decode(entropy, validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise HTTPError(400, "aenvEntropy must be standard base64") from None
        if not 0 < len(seed) <= MAX_ENTROPY_BYTES:
            raise HTTPError(400, f"aenvEntropy must hold 1..{MAX_ENTROPY_BYTES} bytes")
        try:
            kernel.add_entropy(seed, options.entropy_device)
        except OSError as e:
            raise HTTPError(500, f"cannot add entropy: {e}") from None

    timestamp = body.get("timestamp")
    if timestamp and options.set_clock:
        try:
            kernel.set_clock(kernel.parse_rfc3339(str(timestamp)))
        except ValueError as e:
            raise HTTPError(400, f"invalid timestamp: {e}") from None
        except OSError as e:
            log.error("cannot set the clock: %s", e)

    env_vars = body.get("envVars")
    if env_vars is not None:
        if not isinstance(env_vars, dict):
            raise HTTPError(400, "envVars must be an object")
        state.env_vars.update({str(k): str(v) for k, v in env_vars.items()})
    if body.get("defaultUser"):
        state.default_user = str(body["defaultUser"])
    if body.get("defaultWorkdir"):
        state.default_workdir = str(body["defaultWorkdir"])
    if "accessToken" in body:
        token = body["accessToken"]
        state.access_token = str(token) if token else None
    if body.get("aenvVolumes"):
        try:
            await asyncio.to_thread(mounts.ensure, body["aenvVolumes"])
        except mounts.MountError as e:
            raise HTTPError(500, str(e)) from None
    await send_response(send, 204, headers=[(b"cache-control", b"no-store")])
