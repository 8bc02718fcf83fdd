"""Calling nodes from a gateway: one buffered exchange (a create, an internal question, a
page of a listing), or the same request to every node at once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aenv.api.upstream import ConnectFailed, UpstreamError, UpstreamPool
from aenv.cluster.membership import NodeRecord

CALL_TIMEOUT_S = 30.0  # a listing or an internal question; a create waits for its boot
CREATE_TIMEOUT_S = 600.0


class NodeUnreachable(Exception):
    """`connected`: False if no connection was made, so the request surely did not
    reach the node (a create may then be released at once)."""

    def __init__(self, node: str, why: str, connected: bool) -> None:
        super().__init__(f"node {node} did not answer: {why}")
        self.node = node
        self.connected = connected


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k.lower() == name), None)

    def json(self) -> Any:
        return json.loads(self.body)


def address(url: str) -> tuple[str, int]:
    """`http://host:port` of a node record as the upstream pool's address."""
    u = urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"node URL {url!r}: gateways reach nodes over http://host:port")
    return u.hostname, u.port or 80


async def call(pool: UpstreamPool, node: NodeRecord, method: str, target: bytes,
               headers: list[tuple[bytes, bytes]], body: bytes | None = None, *,
               timeout_s: float = CALL_TIMEOUT_S) -> Answer:  # fmt: skip
    """One request to `node`, its answer read whole. NodeUnreachable if the node cannot be
    reached, or broke the exchange."""
    host, port = address(node.url)
    try:
        async with asyncio.timeout(timeout_s):
            resp = await pool.request(
                method, host, port, target, headers,
                body=_once(body) if body is not None else None,
                content_length=str(len(body)).encode() if body is not None else None,
            )  # fmt: skip
            try:
                data = b"".join([chunk async for chunk in resp.body()])
            finally:
                await resp.aclose()
    except (UpstreamError, OSError, TimeoutError) as e:
        raise NodeUnreachable(node.name, str(e) or type(e).__name__,
                              connected=not isinstance(e, ConnectFailed)) from None
    return Answer(resp.status, list(resp.headers), data)


async def call_all(pool: UpstreamPool, nodes: Sequence[NodeRecord], method: str,
                   target: bytes, headers: list[tuple[bytes, bytes]]
                   ) -> list[Answer | NodeUnreachable]:  # fmt: skip
    """The same bodiless request to every node at once, answers in the nodes' order."""
    out = await asyncio.gather(*(call(pool, n, method, target, headers) for n in nodes),
                               return_exceptions=True)  # fmt: skip
    for r in out:
        if isinstance(r, BaseException) and not isinstance(r, NodeUnreachable):
            raise r
    return out  # type: ignore[return-value]


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body
