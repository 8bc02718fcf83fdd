"""The data-plane reverse proxy: a raw ASGI handler in front of FastAPI routing.

A request is data plane when it names a sandbox, in this order:
1. header `E2b-Sandbox-Id` (or `x-agentenv-sandbox-id`), port from `E2b-Sandbox-Port`
   (or `x-agentenv-target-port`), default 49983 (the agent);
2. path prefix `/proxy/<sandbox_id>/<port>/<rest>` (forwarded as `/<rest>`);
3. host `<port>-<sandbox_id>.<domain>` when a domain is configured;
4. `/files` with a `signature` query parameter and none of the above: the running sandbox
   whose access token verifies the signature (e2b-compat.md 6.2).

The exchange itself is `relay.py`'s (full-duplex streaming bodies, WebSocket bridging);
hop-by-hop and routing headers are stripped. A WebSocket handshake (an ASGI `websocket`
scope) is routed and admitted by the same rules as HTTP.

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
import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from aenv.api.relay import (
    Aborted,
    Exchange,
    deny,
    forward_headers,
    install_abort_filter,
    relay_http,
    relay_websocket,
    target_of,
)
from aenv.api.upstream import UpstreamPool
from aenv.machines.api import AGENT_PORT
from aenv.obs import PROXY_REQUESTS
from aenv.orchestrator.errors import TeamLimitReached
from aenv.orchestrator.routes import WAKE_GRACE_S, Route, RouteTable

log = logging.getLogger("aenv.proxy")

Scope = dict[str, Any]
Message = dict[str, Any]

_TRAFFIC_TOKEN = b"e2b-traffic-access-token"
_ROUTING = frozenset({
    b"e2b-sandbox-id", b"e2b-sandbox-port", b"x-agentenv-sandbox-id",
    b"x-agentenv-target-port", b"host", b"expect", _TRAFFIC_TOKEN,
})  # fmt: skip
READY_WAIT_S = 120.0  # the longest a request waits for its sandbox's start to finish
_SID_HEADERS = (b"e2b-sandbox-id", b"x-agentenv-sandbox-id")
_PORT_HEADERS = (b"e2b-sandbox-port", b"x-agentenv-target-port")
UNAUTHORIZED = (
    "unauthorized access, please provide a valid access token or method signing if supported"
)
SIGNATURE_EXPIRED = "signature is already expired"  # envd's text, which E2B's suite asserts
NO_TRAFFIC_TOKEN = ("this sandbox's ports are not public: send its traffic access token in "
                    "the e2b-traffic-access-token header")


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


def file_signature(path: str, op: str, username: str, token: str, expiration: str | None) -> str:
    raw = f"{path}:{op}:{username}:{token}" + (f":{expiration}" if expiration else "")
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).decode().rstrip("=")


def _signature_problem(route: Route, method: str, params: dict[str, list[str]]) -> str | None:
    """Why a signed `/files` URL does not admit its request to `route` (None: it does). As
    envd: the signature is checked first, its expiry after, each with its own 401 text."""
    token = route.access_token
    sig = (params.get("signature") or [""])[0]
    if token is None or not sig:
        return UNAUTHORIZED
    op = "write" if method == "POST" else "read"
    expiration = (params.get("signature_expiration") or [None])[0]
    want = file_signature(
        (params.get("path") or [""])[0], op, (params.get("username") or [""])[0], token,
        expiration,
    )  # fmt: skip
    if not hmac.compare_digest(sig.encode(), want.encode()):
        return UNAUTHORIZED
    if expiration is not None:
        try:
            if int(expiration) < time.time():
                return SIGNATURE_EXPIRED
        except ValueError:
            return UNAUTHORIZED
    return None


def not_found_body(sandbox_id: str) -> dict[str, Any]:
    return {"code": 502, "message": f"The sandbox {sandbox_id} was not found"}


def match_target(
    scope: Scope, domain: bytes | None, agent_port: int = AGENT_PORT
) -> Target | None:
    """The sandbox a request is for (the rules in this module's docstring), or None for
    the control plane. Cheap: one pass over the headers. `domain` is lowercase."""
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
    if domain and host:
        name = host.rsplit(b":", 1)[0].lower() if not host.startswith(b"[") else host
        suffix = b"." + domain
        if name.endswith(suffix):
            label = name[: -len(suffix)]
            p, sep, rest = label.partition(b"-")
            if sep and p.isdigit() and rest and b"." not in rest:
                return Target(rest.decode("latin-1"), _port(p), raw_path)
    if scope["path"] == "/files" and b"signature=" in scope.get("query_string", b""):
        return Target(None, agent_port, raw_path)
    return None


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
        install_abort_filter()

    async def aclose(self) -> None:
        await self.upstream.aclose()

    # -- routing ---------------------------------------------------------------------------

    def match(self, scope: Scope) -> Target | None:
        """The sandbox a request is for, or None for the control plane."""
        return match_target(scope, self.domain, self.agent_port)

    def find_signed(self, method: str, params: dict[str, list[str]]) -> Route | None:
        """The sandbox a signed URL was signed for (expired or not: its request is then
        refused as expired)."""
        for route in self.routes:
            if _signature_problem(route, method, params) in (None, SIGNATURE_EXPIRED):
                return route
        return None

    def _refusal(
        self, route: Route, scope: Scope, method: str, params: dict[str, list[str]] | None
    ) -> str | None:
        """Why a request to the agent is not authorized (the 401's text), or None."""
        token = route.access_token
        if token is None:
            return None
        path = scope["path"]
        if path == "/health" and method == "GET":
            return None
        given = None
        for k, v in scope["headers"]:
            if k == b"x-access-token":
                given = v
                break
        if given is not None:
            return None if hmac.compare_digest(given, token.encode()) else UNAUTHORIZED
        if path == "/files" and method in ("GET", "POST"):
            if params is None:
                params = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            return _signature_problem(route, method, params)
        return UNAUTHORIZED

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
        if target.sandbox_id is None:
            params = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            route = self.find_signed(method, params)
            if route is None:
                return _Denial(401, {"code": 401, "message": UNAUTHORIZED}, "unauthorized")
        else:
            route = self.routes.get(target.sandbox_id)
            if route is None and self.resolve is not None:
                try:
                    route = await self.resolve(target.sandbox_id)
                except TeamLimitReached as e:  # its autoResume would pass its team's limit
                    return _Denial(429, {"code": 429, "message": str(e)}, "team_limit")
            if route is None:
                return _Denial(502, not_found_body(target.sandbox_id), "not_found")
        if target.port == self.agent_port and (
                refused := self._refusal(route, scope, method, params)) is not None:
            return _Denial(401, {"code": 401, "message": refused}, "unauthorized")
        if target.port != self.agent_port and not _traffic_ok(route, scope):
            return _Denial(403, {"code": 403, "message": NO_TRAFFIC_TOKEN}, "no_traffic_token")
        ready = route.handle.ready
        if ready is not None and not ready.done():
            # Its start finishes behind the API call (a fork child's /init, a hot resume's
            # clock push): the guest takes requests once it is done. `wait`: neither this
            # request's cancellation nor the timeout cancels it, and its own cancellation
            # (a kill during the start) is not this request's.
            if route.handle.hurry is not None:
                route.handle.hurry()
            await asyncio.wait({ready}, timeout=READY_WAIT_S)
        if ready is not None and ready.done() and (ready.cancelled() or ready.exception()):
            return _Denial(502, {"code": 502, "message": f"sandbox {route.sandbox_id} failed to "
                                 "start"}, "not_ready")  # fmt: skip
        if ready is not None and not ready.done():  # its guest has not its identity yet: a
            return _Denial(503, {"code": 503, "message": f"sandbox {route.sandbox_id} is still "
                                 "starting: try again"}, "not_ready")  # 401 would mislead
        return route

    async def handle(self, scope: Scope, receive: Any, send: Any, target: Target) -> None:
        websocket = scope["type"] == "websocket"
        if websocket:
            await receive()  # websocket.connect
        route = await self._admit(scope, target)
        if isinstance(route, _Denial):
            PROXY_REQUESTS.labels(route.outcome).inc()
            await deny(scope, send, route.status, route.body)
            return
        ex = Exchange()
        route.streams.add(ex)
        route.last_active, route.reclaimed = time.monotonic(), False
        try:
            if websocket:
                await self._websocket(scope, receive, send, route, target, ex)
            else:
                await self._exchange(scope, receive, send, route, target, ex)
        except asyncio.CancelledError:
            if not ex.taken_back():
                raise
            await self._aborted(scope, send, route, ex)
        finally:
            route.streams.discard(ex)
            route.last_active = time.monotonic()

    async def _aborted(self, scope: Scope, send: Any, route: Route, ex: Exchange) -> None:
        if ex.reason == "client gone":
            PROXY_REQUESTS.labels("client_gone").inc()
            return
        PROXY_REQUESTS.labels("aborted").inc()
        if not ex.response_started:
            await deny(scope, send, 502, not_found_body(route.sandbox_id))
            return
        raise Aborted(ex.reason)

    def _grace(self, route: Route, port: int) -> float | None:
        """Until when a refused connection to one of the sandbox's own ports is tried
        again: for a while after a resume, as the guest may still be starting the server
        that was paused beside it. (The agent answers before a resume returns.)"""
        if route.woke_at is None or port == self.agent_port:
            return None
        return route.woke_at + WAKE_GRACE_S

    async def _websocket(
        self, scope: Scope, receive: Any, send: Any, route: Route, target: Target, ex: Exchange
    ) -> None:
        outcome = await relay_websocket(
            scope, receive, send, (route.handle.slot_addr, target.port),
            target_of(scope, target.raw_path), _sandbox_headers(scope), ex,
            lambda: _port_closed_body(route, target.port),
            tls=target.port in route.ingress.https_ports,
            connect_until=self._grace(route, target.port),
        )  # fmt: skip
        PROXY_REQUESTS.labels(outcome).inc()

    async def _exchange(
        self, scope: Scope, receive: Any, send: Any, route: Route, target: Target, ex: Exchange
    ) -> None:
        try:
            outcome = await relay_http(
                self.upstream, scope, receive, send, (route.handle.slot_addr, target.port),
                target_of(scope, target.raw_path), _sandbox_headers(scope), ex,
                lambda: _port_closed_body(route, target.port),
                tls=target.port in route.ingress.https_ports,
                host_header=route.ingress.host_header(target.port),
                connect_until=self._grace(route, target.port),
            )  # fmt: skip
        except Aborted:
            PROXY_REQUESTS.labels("upstream_broken").inc()
            raise
        PROXY_REQUESTS.labels(outcome).inc()


def _traffic_ok(route: Route, scope: Scope) -> bool:
    """A sandbox whose ports are not public (E2B's allowPublicTraffic false) takes requests
    to them with its traffic access token only."""
    want = route.ingress.traffic_token
    if want is None:
        return True
    given = next((v for k, v in scope["headers"] if k == _TRAFFIC_TOKEN), b"")
    return hmac.compare_digest(given, want.encode())


def _sandbox_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The client's request headers for the sandbox: no hop-by-hop, no routing ones."""
    return forward_headers(scope["headers"], _ROUTING)


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
