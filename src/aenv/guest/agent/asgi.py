"""The few ASGI shapes the agent's plain-HTTP endpoints need (no framework: every import
and every layer costs milliseconds under TCG)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class HTTPError(Exception):
    """An HTTP error answered as envd does: JSON ``{"code": <status>, "message": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ClientGone(Exception):
    """The client disconnected before its request body was complete."""


class Request:
    """Lazy, read-only view of an ASGI HTTP scope."""

    __slots__ = ("_headers", "_query", "receive", "scope")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.scope = scope
        self.receive = receive
        self._headers: dict[str, str] | None = None
        self._query: dict[str, str] | None = None

    @property
    def method(self) -> str:
        return self.scope["method"]

    @property
    def path(self) -> str:
        return self.scope["path"]

    @property
    def headers(self) -> dict[str, str]:
        """Lower-cased header names; repeated headers are joined with ``, ``."""
        if self._headers is None:
            h: dict[str, str] = {}
            for k, v in self.scope["headers"]:
                key = k.decode("latin-1").lower()
                val = v.decode("latin-1")
                h[key] = f"{h[key]}, {val}" if key in h else val
            self._headers = h
        return self._headers

    @property
    def query(self) -> dict[str, str]:
        """Query parameters (the first value of each name wins)."""
        if self._query is None:
            q: dict[str, str] = {}
            raw = self.scope.get("query_string", b"").decode("latin-1")
            for k, v in parse_qsl(raw, keep_blank_values=True, encoding="utf-8"):
                q.setdefault(k, v)
            self._query = q
        return self._query

    async def body_chunks(self) -> AsyncIterator[bytes]:
        """The request body as it arrives (uvicorn applies back-pressure meanwhile)."""
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                raise ClientGone
            chunk = msg.get("body", b"")
            if chunk:
                yield chunk
            if not msg.get("more_body", False):
                return

    async def body(self, limit: int) -> bytes:
        """The whole body, refusing more than ``limit`` bytes with 413."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.body_chunks():
            size += len(chunk)
            if size > limit:
                raise HTTPError(413, f"request body larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)


async def send_response(
    send: Send,
    status: int,
    body: bytes = b"",
    content_type: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Send a complete (non-streamed) response."""
    hdrs = list(headers or ())
    if content_type:
        hdrs.append((b"content-type", content_type.encode()))
    if status not in (204, 304):
        hdrs.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, payload: object) -> None:
    body = json.dumps(payload, separators=(",", ":")).encode()
    await send_response(send, status, body, "application/json")


async def send_error(send: Send, err: HTTPError) -> None:
    await send_json(send, err.status, {"code": err.status, "message": err.message})
