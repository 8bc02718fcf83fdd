"""CORS on the data plane for the web console's origins, to sandboxes' agents only.

The console's terminal and file browser call a sandbox's agent (envd's Connect services and
`/files`) through `/proxy/<id>/49983/`, as E2B's JS SDK calls envd from a browser. Only the
console's origins get CORS headers, and only for the agent's port: a sandbox's own services
keep whatever their servers answer. A preflight is answered here (it carries no token; the
request after it is admitted as any other)."""

from __future__ import annotations

from typing import Any

from aenv.api.relay import Headers

# What the console sends the agent: its token, envd's user (Basic auth) and Connect's headers.
_ALLOW_HEADERS = (b"authorization, content-type, x-access-token, connect-protocol-version, "
                  b"connect-timeout-ms, keepalive-ping-interval")  # fmt: skip
_EXPOSE_HEADERS = b"content-type, content-disposition, content-length"


class ConsoleCors:
    def __init__(self, origins: list[str], agent_port: int) -> None:
        self.origins = {o.encode() for o in origins}
        self.agent_port = agent_port

    def origin(self, scope: dict[str, Any], port: int) -> bytes | None:
        """The request's Origin if it is the console's and the target is the agent."""
        if port != self.agent_port or scope["type"] != "http":
            return None
        for k, v in scope["headers"]:
            if k == b"origin":
                return v if v in self.origins else None
        return None

    @staticmethod
    def is_preflight(scope: dict[str, Any]) -> bool:
        return scope["method"] == "OPTIONS" and any(
            k == b"access-control-request-method" for k, _ in scope["headers"])

    async def preflight(self, send: Any, origin: bytes) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": [
            *self._allow(origin),
            (b"access-control-allow-methods", b"GET, POST"),
            (b"access-control-allow-headers", _ALLOW_HEADERS),
            (b"access-control-max-age", b"600"),
        ]})  # fmt: skip
        await send({"type": "http.response.body", "body": b""})

    def wrap(self, send: Any, origin: bytes) -> Any:
        """`send` with the console's CORS headers on the response (and on a refusal)."""
        extra = [*self._allow(origin), (b"access-control-expose-headers", _EXPOSE_HEADERS)]

        async def with_cors(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [
                    (k, v) for k, v in message.get("headers", [])
                    if not k.startswith(b"access-control-")] + extra}  # fmt: skip
            await send(message)

        return with_cors

    @staticmethod
    def _allow(origin: bytes) -> Headers:
        return [(b"access-control-allow-origin", origin), (b"vary", b"origin")]
