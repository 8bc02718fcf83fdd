"""Calling nodes from a gateway: one buffered exchange (a create, an internal question, a
page of a listing), or the same request to every node at once."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aenv.api.upstream import ConnectFailed, Tls, UpstreamError, UpstreamPool
from aenv.cluster.links import loopback
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


@dataclass(frozen=True)
class NodeLinks:
    """A gateway's connections to its nodes (cluster/links.py): over TLS with the gateway's
    certificate where a node's URL is https; plain HTTP to a node off this host only with
    `insecure`."""

    pool: UpstreamPool
    tls: ssl.SSLContext | None = None
    insecure: bool = False

    def address(self, url: str) -> tuple[str, int, Tls]:
        """Host, port and TLS of a node record's URL; ValueError for one not to use."""
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"node URL {url!r}: gateways reach nodes over http(s)://host:port")
        if u.scheme == "http":
            if not self.insecure and not loopback(url):
                raise ValueError(f"node URL {url} is plain HTTP off this host: the cluster's "
                                 "links need TLS (or cluster.insecure_links)")
            return u.hostname, u.port or 80, False
        if self.tls is None:
            raise ValueError(f"node URL {url} is https: this gateway needs cluster.ca_file, "
                             "cert_file and key_file")
        return u.hostname, u.port or 443, self.tls


async def call(links: NodeLinks, node: NodeRecord, method: str, target: bytes,
               headers: list[tuple[bytes, bytes]], body: bytes | None = None, *,
               timeout_s: float = CALL_TIMEOUT_S) -> Answer:  # fmt: skip
    """One request to `node`, its answer read whole. NodeUnreachable if the node cannot be
    reached, or broke the exchange."""
    try:
        host, port, tls = links.address(node.url)
    except ValueError as e:
        raise NodeUnreachable(node.name, str(e), connected=False) from None
    try:
        async with asyncio.timeout(timeout_s):
            resp = await links.pool.request(
                method, host, port, target, headers,
                body=_once(body) if body is not None else None,
                content_length=str(len(body)).encode() if body is not None else None,
                tls=tls,
            )  # fmt: skip
            try:
                data = b"".join([chunk async for chunk in resp.body()])
            finally:
                await resp.aclose()
    except (UpstreamError, OSError, TimeoutError) as e:
        raise NodeUnreachable(node.name, str(e) or type(e).__name__,
                              connected=not isinstance(e, ConnectFailed)) from None
    return Answer(resp.status, list(resp.headers), data)


async def call_all(links: NodeLinks, nodes: Sequence[NodeRecord], method: str,
                   target: bytes, headers: list[tuple[bytes, bytes]]
                   ) -> list[Answer | NodeUnreachable]:  # fmt: skip
    """The same bodiless request to every node at once, answers in the nodes' order."""
    out = await asyncio.gather(*(call(links, n, method, target, headers) for n in nodes),
                               return_exceptions=True)  # fmt: skip
    for r in out:
        if isinstance(r, BaseException) and not isinstance(r, NodeUnreachable):
            raise r
    return out  # type: ignore[return-value]


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body
