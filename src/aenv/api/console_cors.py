"""CORS for the web console's origins alone, on a node's or a gateway's API.

The console (docs/console.md) calls the control plane with its key, and a sandbox's agent
(envd's Connect services and `/files`, for its terminal and file browser) through the data
plane at `/proxy/<id>/49983/`, as E2B's JS SDK calls envd from a browser. Only the console's
origins get CORS headers, and on the data plane only for the agent's port: a sandbox's own
services keep whatever their servers answer. A preflight is answered here (it carries no
key or token; the request after it is admitted as any other). No cookie ever counts."""

from __future__ import annotations

from typing import Any

from aenv.api.relay import Headers

AGENT_PORT = 49983
# The API key, envd's user (Basic auth), the sandbox's token and Connect's headers.
_ALLOW_HEADERS = (b"x-api-key, content-type, authorization, x-access-token, "
                  b"connect-protocol-version, connect-timeout-ms, keepalive-ping-interval")
_EXPOSE_HEADERS = b"x-next-token, retry-after, content-disposition, content-length"
_METHODS = b"GET, POST, PUT, PATCH, DELETE"


class ConsoleCors:
    def __init__(self, origins: list[str], agent_port: int = AGENT_PORT) -> None:
        self.origins = {o.encode() for o in origins}
        self.agent_port = agent_port

    async def around(self, scope: dict[str, Any], send: Any, port: int | None) -> Any:
        """The `send` to answer with (CORS headers added for a console origin), or None
        when this answered a preflight itself. `port`: the data-plane target's, None for
        the control plane."""
        origin = self._origin(scope, port)
        if origin is None:
            return send
        if scope["method"] == "OPTIONS" and any(
                k == b"access-control-request-method" for k, _ in scope["headers"]):
            await send({"type": "http.response.start", "status": 204, "headers": [
                *_allow(origin), (b"access-control-allow-methods", _METHODS),
                (b"access-control-allow-headers", _ALLOW_HEADERS),
                (b"access-control-max-age", b"600")]})  # fmt: skip
            await send({"type": "http.response.body", "body": b""})
            return None
        extra = [*_allow(origin), (b"access-control-expose-headers", _EXPOSE_HEADERS)]

        async def with_cors(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [
                    (k, v) for k, v in message.get("headers", [])
                    if not k.startswith(b"access-control-")] + extra}  # fmt: skip
            await send(message)

        return with_cors

    def _origin(self, scope: dict[str, Any], port: int | None) -> bytes | None:
        if scope["type"] != "http" or not self.origins:
            return None
        if port is not None and port != self.agent_port:
            return None
        v = next((v for k, v in scope["headers"] if k == b"origin"), None)
        return v if v in self.origins else None


def _allow(origin: bytes) -> Headers:
    return [(b"access-control-allow-origin", origin), (b"vary", b"origin")]
