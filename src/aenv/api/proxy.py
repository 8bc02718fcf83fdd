"""The data-plane reverse proxy: a raw ASGI handler in front of FastAPI routing.

A request is data plane when it names a sandbox, in this order:
1. header `E2b-Sandbox-Id` (or `x-agentenv-sandbox-id`), port from `E2b-Sandbox-Port`
   (or `x-agentenv-target-port`), default 49983 (the agent);
2. path prefix `/proxy/<sandbox_id>/<port>/<rest>` (forwarded as `/<rest>`);
3. host `<port>-<sandbox_id>.<domain>` when a domain is configured;
4. `/files` with a `signature` query parameter and none of the above: the running sandbox
   whose access token verifies the signature (e2b-compat.md 6.2).

Bodies stream both ways, full duplex, through a lean keep-alive HTTP/1.1 client
(`upstream.py`, a pool per upstream address): the response streams back while the request
body may still be going up, and nothing is buffered whole. Hop-by-hop and routing headers
are stripped. A WebSocket handshake (an ASGI `websocket` scope) is routed and admitted by
the same rules and then bridged to a WebSocket on the sandbox's port (`websocket.py`).

An unknown, paused or dead sandbox gets 502 "was not found" (a WebSocket handshake gets
that as its HTTP response), except a paused one created with `autoResume`: the request
resumes it (`resolve`) and then goes through. For a sandbox with an access token, requests
to the agent port must carry `X-Access-Token` (except `GET /health`, and `/files` with a
valid signature). Killing or pausing a sandbox aborts its open exchanges: an HTTP client
sees the connection drop, a WebSocket client a close with code 1001.

Not yet: HTTP/2.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from aenv.api import websocket as ws
from aenv.api.upstream import ConnectFailed, UpstreamError, UpstreamPool
from aenv.machines.api import AGENT_PORT
from aenv.obs import PROXY_OPEN, PROXY_REQUESTS
from aenv.orchestrator.routes import Route, RouteTable

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
_CONTENT_LENGTH = frozenset({b"content-length"})  # the proxy re-frames request bodies
READY_WAIT_S = 60.0  # the longest a request waits for its sandbox's start to finish
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


@dataclass(frozen=True)
class _Denial:
    """A data-plane request refused before it reaches the sandbox."""

    status: int
    body: dict[str, Any]
    outcome: str  # the PROXY_REQUESTS label


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

    def _authorized(
        self, route: Route, scope: Scope, method: str, params: dict[str, list[str]] | None
    ) -> bool:
        token = route.access_token
        if token is None:
            return True
        path = scope["path"]
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

    async def _admit(self, scope: Scope, target: Target) -> Route | _Denial:
        """The route a data-plane request goes to, or why it may not: one set of rules for
        HTTP and WebSocket handshakes (which are GETs)."""
        if target.port < 1:
            return _Denial(400, {"code": 400, "message": "invalid sandbox port"}, "bad_port")
        method = scope.get("method", "GET")
        params = None
        unauthorized = _Denial(401, {"code": 401, "message": UNAUTHORIZED}, "unauthorized")
        if target.sandbox_id is None:
            params = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            route = self._find_signed(method, params)
            if route is None:
                return unauthorized
        else:
            route = self.routes.get(target.sandbox_id)
            if route is None and self.resolve is not None:
                route = await self.resolve(target.sandbox_id)
            if route is None:
                return _Denial(502, not_found_body(target.sandbox_id), "not_found")
        if target.port == self.agent_port and not self._authorized(route, scope, method, params):
            return unauthorized
        ready = route.handle.ready
        if ready is not None and not ready.done():
            # Its start finishes behind the API call (a fork child's /init, a hot resume's
            # clock push): the guest takes requests once it is done. Shielded: this
            # request's cancellation must not cancel it.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(ready), READY_WAIT_S)
        if ready is not None and ready.done() and not ready.cancelled() and ready.exception():
            return _Denial(502, {"code": 502, "message": f"sandbox {route.sandbox_id} failed to "
                                 "start"}, "not_ready")  # fmt: skip
        return route

    async def handle(self, scope: Scope, receive: Any, send: Any, target: Target) -> None:
        websocket = scope["type"] == "websocket"
        if websocket:
            await receive()  # websocket.connect
        route = await self._admit(scope, target)
        if isinstance(route, _Denial):
            PROXY_REQUESTS.labels(route.outcome).inc()
            await _deny(scope, send, route.status, route.body)
            return
        ex = _Exchange()
        route.streams.add(ex)
        try:
            if websocket:
                await self._websocket(scope, receive, send, route, target, ex)
            else:
                await self._exchange(scope, receive, send, route, target, ex)
        except asyncio.CancelledError:
            if ex.reason is None:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await self._aborted(scope, send, route, ex)
        finally:
            route.streams.discard(ex)

    async def _aborted(self, scope: Scope, send: Any, route: Route, ex: _Exchange) -> None:
        if ex.reason == "client gone":
            PROXY_REQUESTS.labels("client_gone").inc()
            return
        PROXY_REQUESTS.labels("aborted").inc()
        if not ex.response_started:
            await _deny(scope, send, 502, not_found_body(route.sandbox_id))
            return
        raise _Aborted(ex.reason)

    async def _websocket(
        self, scope: Scope, receive: Any, send: Any, route: Route, target: Target, ex: _Exchange
    ) -> None:
        qs = scope.get("query_string", b"")
        path = target.raw_path + b"?" + qs if qs else target.raw_path
        try:
            up = await ws.open_upstream(
                route.handle.slot_addr, target.port, path,
                _forward_headers(scope["headers"], ws.HANDSHAKE_HEADERS),
                scope.get("subprotocols") or (),
            )  # fmt: skip
        except ws.Refused as e:
            PROXY_REQUESTS.labels("ws_refused").inc()
            ctype = next((v for k, v in e.headers if k == b"content-type"), b"text/plain")
            await ws.deny(scope, send, e.status, e.body, ctype)
            return
        except ConnectFailed:
            PROXY_REQUESTS.labels("port_closed").inc()
            await _deny(scope, send, 502, _port_closed_body(route, target.port))
            return
        except UpstreamError as e:
            PROXY_REQUESTS.labels("upstream_error").inc()
            await _deny(scope, send, 502, {"code": 502, "message": f"upstream error: {e}"})
            return
        bridge = ws.Bridge(up, receive, send)
        PROXY_OPEN.inc()
        try:
            await send({"type": "websocket.accept", "subprotocol": up.subprotocol,
                        "headers": ws.accept_headers(up, _RESPONSE_DROP)})  # fmt: skip
            ex.response_started = True
            await bridge.run()
            PROXY_REQUESTS.labels("ws_ok").inc()
        except asyncio.CancelledError:
            if ex.reason is None or not ex.response_started:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            PROXY_REQUESTS.labels("client_gone" if ex.reason == "client gone" else "aborted").inc()
            await bridge.end(ws.CLOSE_GOING_AWAY, ex.reason)
        finally:
            PROXY_OPEN.dec()
            up.transport.abort()  # idempotent; also covers a failed accept

    async def _exchange(
        self, scope: Scope, receive: Any, send: Any, route: Route, target: Target, ex: _Exchange
    ) -> None:
        length: bytes | None = None
        chunked = False
        for k, v in scope["headers"]:
            if k == b"content-length":
                length = v.strip()
            elif k == b"transfer-encoding":
                chunked = True
        has_body = chunked or (length is not None and length != b"0")
        headers = _forward_headers(scope["headers"], _CONTENT_LENGTH)
        if length is not None and not has_body:
            headers.append((b"content-length", length))
        if chunked:
            length = None  # Transfer-Encoding wins over Content-Length (RFC 9112 6.3)
        qs = scope.get("query_string", b"")
        path = target.raw_path + b"?" + qs if qs else target.raw_path
        # Set once the request body has been read to its end: until then it owns `receive`.
        body_read = asyncio.Event() if has_body else None
        try:
            response = await self.upstream.request(
                scope["method"], route.handle.slot_addr, target.port, path, headers,
                body=_body(receive, body_read) if body_read is not None else None,
                content_length=length,
            )  # fmt: skip
        except ConnectFailed:
            PROXY_REQUESTS.labels("port_closed").inc()
            await send_json(send, 502, _port_closed_body(route, target.port))
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
                watcher = asyncio.create_task(_watch_disconnect(receive, ex, body_read))
            try:
                async for chunk in response.body():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except _ClientGone:  # while its request body was still coming (full duplex)
                PROXY_REQUESTS.labels("client_gone").inc()
                return
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


async def _body(receive: Any, read: asyncio.Event):  # type: ignore[no-untyped-def]
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise _ClientGone
        chunk = msg.get("body", b"")
        if chunk:
            yield chunk
        if not msg.get("more_body", False):
            read.set()
            return


async def _watch_disconnect(
    receive: Any, ex: _Exchange, body_read: asyncio.Event | None
) -> None:
    if body_read is not None:
        await body_read.wait()  # one reader of `receive` at a time: the body's comes first
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            ex.abort("client gone")
            return


def _forward_headers(
    headers: list[tuple[bytes, bytes]], drop: frozenset[bytes]
) -> list[tuple[bytes, bytes]]:
    """The client's request headers for the sandbox: no hop-by-hop (nor those `Connection`
    lists), no routing headers, none in `drop`."""
    listed: set[bytes] = set()
    for k, v in headers:
        if k == b"connection":
            listed.update(t.strip().lower() for t in v.split(b","))
    return [
        (k, v)
        for k, v in headers
        if k not in _HOP_BY_HOP and k not in _ROUTING and k not in listed and k not in drop
    ]


async def _deny(scope: Scope, send: Any, status: int, body: dict[str, Any]) -> None:
    if scope["type"] == "websocket":
        await ws.deny(scope, send, status, json.dumps(body, separators=(",", ":")).encode())
    else:
        await send_json(send, status, body)


def _port_closed_body(route: Route, port: int) -> dict[str, Any]:
    return {"code": 502, "message": "The sandbox is running but port is not open",
            "sandboxId": route.sandbox_id, "port": port}  # fmt: skip


def _port(raw: bytes | None) -> int:
    if raw is None:
        return AGENT_PORT
    try:
        port = int(raw)
    except ValueError:
        return 0
    return port if 0 < port < 65536 else 0
