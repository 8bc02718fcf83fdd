"""WebSocket sessions of the data-plane proxy: one upstream WebSocket per client WebSocket.

The proxy (`proxy.py`) routes and admits the handshake like any data-plane request; this
module opens the WebSocket to the sandbox's port and relays messages both ways as they are
(text stays text, binary stays binary) until either side closes, passing the close code and
reason on. Each hop negotiates its own extensions (compression) and answers its own pings:
the ASGI server on the client side, the `websockets` client here on the sandbox side.

    up = await open_upstream(addr, port, b"/path?q", headers, ["chat"])  # or Refused/...
    await Bridge(up, receive, send).run()   # after websocket.accept; ends on either close

Buffering is bounded by both libraries' message queues and write limits, and a message is
at most `MAX_MESSAGE` bytes in either direction.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import ssl
from collections.abc import Sequence
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from aenv.api.upstream import ConnectFailed, UpstreamError

# The ASGI server's default inbound limit (uvicorn ws_max_size): the same limit upstream,
# so a sandbox cannot make the node hold a bigger message than a client could send it.
MAX_MESSAGE = 16 * 1024 * 1024
# Connect + upgrade handshake with the in-guest server. Guests under TCG can be slow to
# answer; the TCP connect itself is bounded by the same figure.
OPEN_TIMEOUT_S = 30.0
# A sandbox that stops answering pings (a wedged server) ends the session.
PING_INTERVAL_S = 20.0
PING_TIMEOUT_S = 20.0
CLOSE_TIMEOUT_S = 5.0

# Per-hop handshake headers: never forwarded in either direction.
HANDSHAKE_HEADERS = frozenset({
    b"sec-websocket-key", b"sec-websocket-version", b"sec-websocket-extensions",
    b"sec-websocket-protocol", b"sec-websocket-accept",
})  # fmt: skip

CLOSE_GOING_AWAY = 1001  # the sandbox was killed or paused, or the node is shutting down
_CLOSE_BAD_GATEWAY = 1014  # the sandbox's side dropped without a close frame
# Codes only ever reported locally, never sent in a close frame: what to send instead.
_SENDABLE = {1005: 1000, 1006: CLOSE_GOING_AWAY}  # no status given; dropped without a close


class Refused(UpstreamError):
    """The sandbox answered the upgrade with an HTTP response (not 101): relay it."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        super().__init__(f"upgrade refused with HTTP {status}")
        self.status = status
        self.headers = headers
        self.body = body


class _NoRedirects(connect):
    """A redirect is the sandbox's answer to relay, never an address for the node to try."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


async def open_upstream(
    host: str, port: int, target: bytes, headers: Sequence[tuple[bytes, bytes]],
    subprotocols: Sequence[str], tls: ssl.SSLContext | None = None,
) -> ClientConnection:  # fmt: skip
    """Open a WebSocket to `host:port` (over TLS with `tls`) with the client's `target`
    (path?query), headers and offered subprotocols. Raises ConnectFailed, Refused or
    UpstreamError."""
    uri = f"{'wss' if tls else 'ws'}://{host}:{port}{target.decode('latin-1')}"
    try:
        return await _NoRedirects(
            uri, ssl=tls, additional_headers=[(k.decode("latin-1"), v.decode("latin-1"))
                                              for k, v in headers],
            subprotocols=list(subprotocols) or None,  # type: ignore[arg-type]
            compression=None,  # the hop to a local slot gains nothing from deflate
            user_agent_header=None, proxy=None, open_timeout=OPEN_TIMEOUT_S,
            ping_interval=PING_INTERVAL_S, ping_timeout=PING_TIMEOUT_S,
            close_timeout=CLOSE_TIMEOUT_S, max_size=MAX_MESSAGE,
        )  # fmt: skip
    except InvalidStatus as e:
        r = e.response
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in r.headers.raw_items()]
        raise Refused(r.status_code, raw, r.body or b"") from None
    except (OSError, TimeoutError) as e:
        raise ConnectFailed(repr(e)) from None
    except (WebSocketException, EOFError) as e:
        raise UpstreamError(f"bad upgrade response: {e}") from None


def accept_headers(up: ClientConnection, drop: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """The upstream's handshake response headers worth passing on (cookies, custom ones)."""
    assert up.response is not None
    out = []
    for k, v in up.response.headers.raw_items():
        lk = k.lower().encode("latin-1")
        if lk not in drop and lk not in HANDSHAKE_HEADERS:
            out.append((lk, v.encode("latin-1")))
    return out


async def deny(scope: dict[str, Any], send: Any, status: int, body: bytes,
               content_type: bytes = b"application/json") -> None:  # fmt: skip
    """Refuse a handshake with an HTTP response when the server can send one (the ASGI
    `websocket.http.response` extension), else with a close carrying the message."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        if status not in http.HTTPStatus._value2member_map_:
            status = 502  # the server only takes statuses it has names for
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": [(b"content-type", content_type),
                                (b"content-length", str(len(body)).encode())]})  # fmt: skip
        await send({"type": "websocket.http.response.body", "body": body})
        return
    try:
        reason = str(json.loads(body)["message"])
    except (ValueError, KeyError, TypeError):
        reason = f"HTTP {status}"
    await send({"type": "websocket.close", "code": 1008 if status < 500 else 1011,
                "reason": reason.encode()[:120].decode(errors="ignore")})  # fmt: skip


class Bridge:
    """Relays one accepted client WebSocket and its upstream until either side closes.

    Client messages are read in the calling task, upstream messages in a second one. A
    client close goes to the sandbox with the same code; a sandbox close goes to the client
    with its code and reason (1014 if it dropped without one). `end()` closes the client
    from outside (sandbox killed); `run()` always releases the upstream connection."""

    def __init__(self, up: ClientConnection, receive: Any, send: Any) -> None:
        self.up = up
        self._receive = receive
        self._send = send
        self._client_done = False  # a close went to the client, or the client is gone

    async def run(self) -> None:
        down = asyncio.create_task(self._upstream_to_client())
        try:
            code = await self._client_to_upstream()
            # The client closed: pass its close on and let the sandbox answer it.
            with contextlib.suppress(WebSocketException, OSError):
                await self.up.close(_sendable(code))
            await down
        finally:
            down.cancel()
            self.up.transport.abort()

    async def end(self, code: int, reason: str) -> None:
        """Close the client's side now, unless it already is closed."""
        if self._client_done:
            return
        self._client_done = True
        with contextlib.suppress(OSError, RuntimeError):
            await self._send({"type": "websocket.close", "code": code, "reason": reason})

    async def _client_to_upstream(self) -> int:
        """Client messages to the sandbox; the client's close code when it goes away."""
        up, receive = self.up, self._receive
        while True:
            msg = await receive()
            kind = msg["type"]
            if kind == "websocket.receive":
                data = msg.get("bytes")
                if data is None:
                    data = msg.get("text")
                try:
                    await up.send(data)
                except ConnectionClosed:
                    continue  # the sandbox closed: its close is on its way to the client
            elif kind == "websocket.disconnect":
                self._client_done = True
                return int(msg.get("code", 1000))

    async def _upstream_to_client(self) -> None:
        up, send = self.up, self._send
        try:
            while True:
                data = await up.recv()
                if self._client_done:
                    return
                if isinstance(data, str):
                    await send({"type": "websocket.send", "text": data})
                else:
                    await send({"type": "websocket.send", "bytes": data})
        except ConnectionClosed as e:
            if e.rcvd is not None:  # the sandbox closed: its code and reason
                await self.end(_sendable(e.rcvd.code), e.rcvd.reason)
            elif e.sent is not None and e.sent.code != 1000:  # we failed it (too big, ping)
                await self.end(e.sent.code, e.sent.reason)
            else:
                await self.end(_CLOSE_BAD_GATEWAY, "sandbox connection lost")
        except OSError:
            self._client_done = True  # the client went away while we were sending


def _sendable(code: int) -> int:
    return _SENDABLE.get(code, code)
