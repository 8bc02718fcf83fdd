"""Relaying one ASGI request to an upstream HTTP server: the part the node's data-plane
proxy (`proxy.py`, upstream = a sandbox's slot) and the cluster gateway (upstream = a node)
share.

Bodies stream both ways, full duplex, through `upstream.py`'s keep-alive client: the
response streams back while the request body may still be going up, and nothing is
buffered whole. A WebSocket handshake (an ASGI `websocket` scope) is bridged to a WebSocket
on the upstream (`websocket.py`). An `Exchange` can be aborted from outside (a sandbox
killed, a client gone): an HTTP client then sees the connection drop, a WebSocket client a
close with code 1001.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aenv.api import websocket as ws
from aenv.api.upstream import ConnectFailed, Tls, UpstreamError, UpstreamPool, tls_context
from aenv.obs import PROXY_OPEN

Scope = dict[str, Any]
Headers = list[tuple[bytes, bytes]]

HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"proxy-connection",
})  # fmt: skip
RESPONSE_DROP = HOP_BY_HOP | {b"date", b"server"}
_CONTENT_LENGTH = frozenset({b"content-length"})  # request bodies are re-framed


class Aborted(Exception):
    """Raised after the response started to make the server drop the connection."""


class ClientGone(Exception):
    pass


class Exchange:
    """One relayed request/response, abortable from outside (kill, shutdown, disconnect)."""

    __slots__ = ("reason", "response_started", "task")

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.reason: str | None = None
        self.response_started = False

    def abort(self, reason: str = "sandbox gone") -> None:
        if self.reason is None and self.task is not None:
            self.reason = reason
            self.task.cancel()

    def taken_back(self) -> bool:
        """In an `except CancelledError`: True if the cancellation was this exchange's own
        abort (now undone, so the task may answer), False if it came from outside (re-raise
        it)."""
        if self.reason is None:
            return False
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return True


class UvicornAbortFilter(logging.Filter):
    """Keeps uvicorn from logging a deliberate `Aborted` as an application error."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, Aborted)


def install_abort_filter() -> None:
    uv = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, UvicornAbortFilter) for f in uv.filters):
        uv.addFilter(UvicornAbortFilter())


async def send_json(send: Any, status: int, body: dict[str, Any],
                    headers: Headers | None = None) -> None:  # fmt: skip
    data = json.dumps(body, separators=(",", ":")).encode()
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()), *(headers or ())],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": data})


async def deny(scope: Scope, send: Any, status: int, body: dict[str, Any]) -> None:
    """A JSON error as the HTTP response, or as a WebSocket handshake's refusal."""
    if scope["type"] == "websocket":
        await ws.deny(scope, send, status, json.dumps(body, separators=(",", ":")).encode())
    else:
        await send_json(send, status, body)


def forward_headers(headers: Headers, drop: frozenset[bytes]) -> Headers:
    """The client's request headers for the upstream: no hop-by-hop (nor those `Connection`
    lists), none in `drop`."""
    listed: set[bytes] = set()
    for k, v in headers:
        if k == b"connection":
            listed.update(t.strip().lower() for t in v.split(b","))
    return [(k, v) for k, v in headers if k not in HOP_BY_HOP and k not in listed
            and k not in drop]  # fmt: skip


def target_of(scope: Scope, raw_path: bytes) -> bytes:
    qs = scope.get("query_string", b"")
    return raw_path + b"?" + qs if qs else raw_path


T = TypeVar("T")
RETRY_CONNECT_S = 0.1


async def connected(attempt: Callable[[], Awaitable[T]], until: float | None) -> T:
    """attempt(), tried again every RETRY_CONNECT_S while it raises ConnectFailed and
    `until` (time.monotonic()) is not reached."""
    while True:
        try:
            return await attempt()
        except ConnectFailed:
            if until is None or time.monotonic() + RETRY_CONNECT_S > until:
                raise
        await asyncio.sleep(RETRY_CONNECT_S)


async def relay_http(
    pool: UpstreamPool, scope: Scope, receive: Any, send: Any, addr: tuple[str, int],
    target: bytes, headers: Headers, ex: Exchange,
    connect_failed: Callable[[], dict[str, Any]], *, tls: Tls = False,
    host_header: bytes | None = None, connect_until: float | None = None,
) -> str:  # fmt: skip
    """Relay the request to `addr` (`headers` already filtered; the body's framing is
    taken from the scope), over TLS if `tls`, with `host_header` as Host if given, trying
    to connect until `connect_until` (a refused connect leaves the body unread). Returns
    the outcome: ok, port_closed, client_gone, upstream_error. Raises Aborted when the
    upstream breaks mid-response."""
    length: bytes | None = None
    chunked = False
    for k, v in scope["headers"]:
        if k == b"content-length":
            length = v.strip()
        elif k == b"transfer-encoding":
            chunked = True
    has_body = chunked or (length is not None and length != b"0")
    headers = [h for h in headers if h[0] not in _CONTENT_LENGTH]
    if length is not None and not has_body:
        headers.append((b"content-length", length))
    if chunked:
        length = None  # Transfer-Encoding wins over Content-Length (RFC 9112 6.3)
    # Set once the request body has been read to its end: until then it owns `receive`.
    body_read = asyncio.Event() if has_body else None
    try:
        response = await connected(lambda: pool.request(
            scope["method"], addr[0], addr[1], target, headers,
            body=_body(receive, body_read) if body_read is not None else None,
            content_length=length, tls=tls, host_header=host_header,
        ), connect_until)  # fmt: skip
    except ConnectFailed:
        await send_json(send, 502, connect_failed())
        return "port_closed"
    except ClientGone:
        return "client_gone"
    except UpstreamError as e:
        await send_json(send, 502, {"code": 502, "message": f"upstream error: {e}"})
        return "upstream_error"
    watcher: asyncio.Task[None] | None = None
    PROXY_OPEN.inc()
    try:
        out = [(k, v) for k, v in response.headers if k.lower() not in RESPONSE_DROP]
        await send({"type": "http.response.start", "status": response.status, "headers": out})
        ex.response_started = True
        if not response.has_length:
            # A stream: notice a client that goes away, or it would pin the upstream.
            watcher = asyncio.create_task(_watch_disconnect(receive, ex, body_read))
        try:
            async for chunk in response.body():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except ClientGone:  # while its request body was still coming (full duplex)
            return "client_gone"
        except UpstreamError as e:
            raise Aborted(f"upstream broke: {e}") from None
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return "ok"
    finally:
        PROXY_OPEN.dec()
        if watcher is not None:
            watcher.cancel()
        await response.aclose()


async def relay_websocket(
    scope: Scope, receive: Any, send: Any, addr: tuple[str, int], target: bytes,
    headers: Headers, ex: Exchange, connect_failed: Callable[[], dict[str, Any]], *,
    tls: Tls = False, connect_until: float | None = None,
) -> str:  # fmt: skip
    """Bridge an accepted-to-be client WebSocket (its `websocket.connect` already received)
    to one opened at `addr` (over TLS if `tls`). Returns the outcome: ws_ok, ws_refused,
    port_closed, upstream_error, client_gone or aborted."""
    try:
        up = await connected(lambda: ws.open_upstream(
            addr[0], addr[1], target, forward_headers(headers, ws.HANDSHAKE_HEADERS),
            scope.get("subprotocols") or (), tls_context(tls),
        ), connect_until)  # fmt: skip
    except ws.Refused as e:
        ctype = next((v for k, v in e.headers if k == b"content-type"), b"text/plain")
        await ws.deny(scope, send, e.status, e.body, ctype)
        return "ws_refused"
    except ConnectFailed:
        await deny(scope, send, 502, connect_failed())
        return "port_closed"
    except UpstreamError as e:
        await deny(scope, send, 502, {"code": 502, "message": f"upstream error: {e}"})
        return "upstream_error"
    bridge = ws.Bridge(up, receive, send)
    PROXY_OPEN.inc()
    try:
        await send({"type": "websocket.accept", "subprotocol": up.subprotocol,
                    "headers": ws.accept_headers(up, RESPONSE_DROP)})  # fmt: skip
        ex.response_started = True
        await bridge.run()
        return "ws_ok"
    except asyncio.CancelledError:
        if not ex.response_started or not ex.taken_back():
            raise
        await bridge.end(ws.CLOSE_GOING_AWAY, ex.reason)
        return "client_gone" if ex.reason == "client gone" else "aborted"
    finally:
        PROXY_OPEN.dec()
        up.transport.abort()  # idempotent; also covers a failed accept


async def _body(receive: Any, read: asyncio.Event):  # type: ignore[no-untyped-def]
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientGone
        chunk = msg.get("body", b"")
        if chunk:
            yield chunk
        if not msg.get("more_body", False):
            read.set()
            return


async def _watch_disconnect(receive: Any, ex: Exchange, body_read: asyncio.Event | None) -> None:
    if body_read is not None:
        await body_read.wait()  # one reader of `receive` at a time: the body's comes first
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            ex.abort("client gone")
            return
