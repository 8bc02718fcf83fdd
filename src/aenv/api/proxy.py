"""The data-plane reverse proxy: a raw ASGI handler in front of FastAPI routing.

A request is data plane when it names a sandbox, in this order:
1. header `E2b-Sandbox-Id` (or `x-agentenv-sandbox-id`), port from `E2b-Sandbox-Port`
   (or `x-agentenv-target-port`), default 49983 (the agent);
2. path prefix `/proxy/<sandbox_id>/<port>/<rest>` (forwarded as `/<rest>`);
3. host `<port>-<sandbox_id>.<domain>` when a domain is configured;
4. `/files` with a `signature` query parameter and none of the above: the running sandbox
   whose access token verifies the signature (e2b-compat.md 6.2).

Bodies stream both ways through a lean keep-alive HTTP/1.1 client (`upstream.py`, a pool
per upstream address); nothing is buffered. Hop-by-hop and routing headers are stripped. An
unknown, paused or dead sandbox gets 502 "was not found", except a paused one created with
`autoResume`: the request resumes it (`resolve`) and then goes through. For a sandbox with
an access token, requests to the agent port must carry `X-Access-Token` (except
`GET /health`, and `/files` with a valid signature). Killing a sandbox aborts its open
exchanges: the client sees the connection drop.

Not yet: WebSocket upgrades (answered with a close), HTTP/2.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from aenv.api.upstream import ConnectFailed, UpstreamError, UpstreamPool
from aenv.orchestrator.obs import PROXY_OPEN, PROXY_REQUESTS
from aenv.orchestrator.routes import Route, RouteTable
from aenv.orchestrator.runtime_api import AGENT_PORT

log = logging.getLogger("aenv.proxy")

Scope = dict[str, Any]
Message = dict[str, Any]

_HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"proxy-connection",
})  # fmt: skip
_ROUTING = frozenset({
    b"e2b-sandbox-id", b"e2b-sandbox-port", b"x-agentenv-sandbox-id",
    b"x-agentenv-target-port", b"host", b"expect",
})  # fmt: skip
_RESPONSE_DROP = _HOP_BY_HOP | {b"date", b"server"}
_SID_HEADERS = (b"e2b-sandbox-id", b"x-agentenv-sandbox-id")
_PORT_HEADERS = (b"e2b-sandbox-port", b"x-agentenv-target-port")
UNAUTHORIZED = (
    "unauthorized access, please provide a valid access token or method signing if supported"
)


@dataclass(frozen=True)
class Target:
    sandbox_id: str | None  # None: find it by the /files signature
    port: int
    raw_path: bytes


class _Aborted(Exception):
    """Raised after the response started to make the server drop the connection."""


class _Exchange:
    """One proxied request/response, abortable from outside (kill, shutdown, disconnect)."""

    __slots__ = ("reason", "response_started", "task")

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.reason: str | None = None
        self.response_started = False

    def abort(self, reason: str = "sandbox gone") -> None:
        if self.reason is None and self.task is not None:
            self.reason = reason
            self.task.cancel()


class _UvicornAbortFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, _Aborted)


def file_signature(path: str, op: str, username: str, token: str, expiration: str | None) -> str:
    raw = f"{path}:{op}:{username}:{token}" + (f":{expiration}" if expiration else "")
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).decode().rstrip("=")


def _signature_ok(route: Route, method: str, params: dict[str, list[str]]) -> bool:
    token = route.access_token
    sig = (params.get("signature") or [""])[0]
    if token is None or not sig:
        return False
    op = "write" if method == "POST" else "read"
    expiration = (params.get("signature_expiration") or [None])[0]
    if expiration is not None:
        try:
            if int(expiration) < time.time():
                return False
        except ValueError:
            return False
    want = file_signature(
        (params.get("path") or [""])[0], op, (params.get("username") or [""])[0], token,
        expiration,
    )  # fmt: skip
    return hmac.compare_digest(sig.encode(), want.encode())


async def send_json(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode())],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": data})


def not_found_body(sandbox_id: str) -> dict[str, Any]:
    return {"code": 502, "message": f"The sandbox {sandbox_id} was not found"}


class DataPlaneProxy:
    def __init__(
        self, routes: RouteTable, domain: str | None = None, agent_port: int = AGENT_PORT,
        resolve: Callable[[str], Awaitable[Route | None]] | None = None,
    ) -> None:
        self.routes = routes
        # Called for a sandbox with no route (e.g. paused): a route to use, or None for 502.
        self.resolve = resolve
        self.domain = domain.lower().encode() if domain else None
        self.agent_port = agent_port
        self.upstream = UpstreamPool()
        routes.on_remove.append(self._forget)
        uv = logging.getLogger("uvicorn.error")
        if not any(isinstance(f, _UvicornAbortFilter) for f in uv.filters):
            uv.addFilter(_UvicornAbortFilter())

    async def aclose(self) -> None:
        await self.upstream.aclose()

    # -- routing ---------------------------------------------------------------------------

    def match(self, scope: Scope) -> Target | None:
        """The sandbox a request is for, or None for the control plane. Cheap: one pass."""
        sid = port = host = None
        for k, v in scope["headers"]:
            if k in _SID_HEADERS:
                sid = v
            elif k in _PORT_HEADERS:
                port = v
            elif k == b"host":
                host = v
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        if sid is not None:
            return Target(sid.decode("latin-1"), _port(port), raw_path)
        if raw_path.startswith(b"/proxy/"):
            parts = raw_path.split(b"/", 4)  # ['', 'proxy', id, port, rest]
            if len(parts) >= 4 and parts[2]:
                rest = b"/" + parts[4] if len(parts) == 5 else b"/"
                return Target(parts[2].decode("latin-1"), _port(parts[3]), rest)
        if self.domain and host:
            name = host.rsplit(b":", 1)[0].lower() if not host.startswith(b"[") else host
            suffix = b"." + self.domain
            if name.endswith(suffix):
                label = name[: -len(suffix)]
                p, sep, rest = label.partition(b"-")
                if sep and p.isdigit() and rest and b"." not in rest:
                    return Target(rest.decode("latin-1"), _port(p), raw_path)
        if scope["path"] == "/files" and b"signature=" in scope.get("query_string", b""):
            return Target(None, self.agent_port, raw_path)
        return None

    def _find_signed(self, method: str, params: dict[str, list[str]]) -> Route | None:
        for route in self.routes:
            if _signature_ok(route, method, params):
                return route
        return None

    def _authorized(self, route: Route, scope: Scope, params: dict[str, list[str]] | None) -> bool:
        token = route.access_token
        if token is None:
            return True
        method, path = scope["method"], scope["path"]
        if path == "/health" and method == "GET":
            return True
        given = None
        for k, v in scope["headers"]:
            if k == b"x-access-token":
                given = v
                break
        if given is not None:
            return hmac.compare_digest(given, token.encode())
        if path == "/files" and method in ("GET", "POST"):
            if params is None:
                params = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            return _signature_ok(route, method, params)
        return False

    def _forget(self, route: Route) -> None:
        """Drop idle pooled connections to a removed sandbox's slot: the address is reused."""
        self.upstream.forget_host(route.handle.slot_addr)

    # -- exchange --------------------------------------------------------------------------

    async def handle(self, scope: Scope, receive: Any, send: Any, target: Target) -> None:
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1011, "reason": "not supported yet"})
            return
        if target.port < 1:
            PROXY_REQUESTS.labels("bad_port").inc()
            await send_json(send, 400, {"code": 400, "message": "invalid sandbox port"})
            return
        params = None
        if target.sandbox_id is None:
            params = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            route = self._find_signed(scope["method"], params)
            if route is None:
                PROXY_REQUESTS.labels("unauthorized").inc()
                await send_json(send, 401, {"code": 401, "message": UNAUTHORIZED})
                return
        else:
            route = self.routes.get(target.sandbox_id)
            if route is None and self.resolve is not None:
                route = await self.resolve(target.sandbox_id)
            if route is None:
                PROXY_REQUESTS.labels("not_found").inc()
                await send_json(send, 502, not_found_body(target.sandbox_id))
                return
        if target.port == self.agent_port and not self._authorized(route, scope, params):
            PROXY_REQUESTS.labels("unauthorized").inc()
            await send_json(send, 401, {"code": 401, "message": UNAUTHORIZED})
            return
        ex = _Exchange()
        route.streams.add(ex)
        try:
            await self._exchange(scope, receive, send, route, target, ex)
        except asyncio.CancelledError:
            if ex.reason is None:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await self._aborted(send, route, ex)
        finally:
            route.streams.discard(ex)

    async def _aborted(self, send: Any, route: Route, ex: _Exchange) -> None:
        PROXY_REQUESTS.labels("aborted").inc()
        if ex.reason == "client gone":
            return
        if not ex.response_started:
            await send_json(send, 502, not_found_body(route.sandbox_id))
            return
        raise _Aborted(ex.reason)

    async def _exchange(
        self, scope: Scope, receive: Any, send: Any, route: Route, target: Target, ex: _Exchange
    ) -> None:
        headers: list[tuple[bytes, bytes]] = []
        length: bytes | None = None
        chunked = False
        conn_listed: set[bytes] = set()
        for k, v in scope["headers"]:
            if k == b"connection":
                conn_listed.update(t.strip().lower() for t in v.split(b","))
            elif k == b"content-length":
                length = v.strip()
            elif k == b"transfer-encoding":
                chunked = True
        has_body = chunked or (length is not None and length != b"0")
        for k, v in scope["headers"]:
            if k in _HOP_BY_HOP or k in _ROUTING or k in conn_listed or k == b"content-length":
                continue
            headers.append((k, v))
        if length is not None and not has_body:
            headers.append((b"content-length", length))
        if chunked:
            length = None  # Transfer-Encoding wins over Content-Length (RFC 9112 6.3)
        qs = scope.get("query_string", b"")
        path = target.raw_path + b"?" + qs if qs else target.raw_path
        try:
            response = await self.upstream.request(
                scope["method"], route.handle.slot_addr, target.port, path, headers,
                body=_body(receive) if has_body else None, content_length=length,
            )  # fmt: skip
        except ConnectFailed:
            PROXY_REQUESTS.labels("port_closed").inc()
            await send_json(send, 502, {
                "code": 502, "message": "The sandbox is running but port is not open",
                "sandboxId": route.sandbox_id, "port": target.port,
            })  # fmt: skip
            return
        except _ClientGone:
            PROXY_REQUESTS.labels("client_gone").inc()
            return
        except UpstreamError as e:
            PROXY_REQUESTS.labels("upstream_error").inc()
            await send_json(send, 502, {"code": 502, "message": f"upstream error: {e}"})
            return
        watcher: asyncio.Task[None] | None = None
        PROXY_OPEN.inc()
        try:
            out = [(k, v) for k, v in response.headers if k.lower() not in _RESPONSE_DROP]
            await send({"type": "http.response.start", "status": response.status,
                        "headers": out})  # fmt: skip
            ex.response_started = True
            if not response.has_length:
                # A stream: notice a client that goes away, or it would pin the upstream.
                watcher = asyncio.create_task(_watch_disconnect(receive, ex))
            try:
                async for chunk in response.body():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except UpstreamError as e:
                PROXY_REQUESTS.labels("upstream_broken").inc()
                raise _Aborted(f"upstream broke: {e}") from None
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            PROXY_REQUESTS.labels("ok").inc()
        finally:
            PROXY_OPEN.dec()
            if watcher is not None:
                watcher.cancel()
            await response.aclose()


class _ClientGone(Exception):
    pass


async def _body(receive: Any):  # type: ignore[no-untyped-def]
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _ClientGone
        chunk = msg.get("body", b"")
        if chunk:
            yield chunk
        if not msg.get("more_body", False):
            return


async def _watch_disconnect(receive: Any, ex: _Exchange) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            ex.abort("client gone")
            return


def _port(raw: bytes | None) -> int:
    if raw is None:
        return AGENT_PORT
    try:
        port = int(raw)
    except ValueError:
        return 0
    return port if 0 < port < 65536 else 0
