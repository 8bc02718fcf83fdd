"""Listings over every node, as one node would answer them.

`GET /v2/sandboxes` and `GET /snapshots` are keyset-paged: every item has a cursor
(started or created time in µs, then id) and a page is the `limit` items after the one the
`nextToken` names, in one order. The gateway sends every node the same query; each answers
with the items of its first page and, because the gateway presents the cluster token, each
item's cursor (`x-aenv-cursors`). The first `limit` of all those, in order, are exactly the
cluster's page: no node can have an item that belongs in it beyond its own first `limit`.
The next token is the last item's cursor, so pages stay stable however items are spread
and whichever gateway serves the next page.

`GET /sandboxes` (v1, unpaged) is the nodes' lists end to end; `GET /templates` dedups by
id (nodes that share a data directory list the same templates); `GET /sandboxes/metrics`
joins the nodes' maps (each has its own sandboxes' samples).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs

from aenv.api.query import decode_cursor  # the nodes' own format
from aenv.api.relay import target_of
from aenv.cluster import wire
from aenv.cluster.gateway import overview
from aenv.cluster.gateway.nodes import Answer, NodeLinks, NodeUnreachable, call_all
from aenv.cluster.membership import NodeRecord

_NEXT = b"x-next-token"


class Merged:
    """A merged listing: its status, JSON body and the headers to add."""

    def __init__(self, status: int, body: object, headers: list[tuple[bytes, bytes]]) -> None:
        self.status, self.body, self.headers = status, body, headers


def _first_failure(answers: Sequence[Answer | NodeUnreachable]) -> Merged | None:
    for a in answers:
        if isinstance(a, NodeUnreachable):
            return Merged(502, {"code": 502, "message": str(a)}, [])
    for a in answers:
        if a.status != 200:  # the same query fails on every node alike (400, 401)
            try:
                return Merged(a.status, a.json(), [])
            except ValueError:
                return Merged(502, {"code": 502, "message": f"a node answered {a.status}"}, [])
    return None


def merge(kind: str, query: bytes, answers: Sequence[Answer | NodeUnreachable]) -> Merged:
    failed = _first_failure(answers)
    if failed is not None:
        return failed
    ok = [a for a in answers if isinstance(a, Answer)]
    if kind == "overview":
        return Merged(200, overview.join([a.json() for a in ok]), [])
    if kind == "sandboxes":
        return Merged(200, [item for a in ok for item in a.json()], [])
    if kind == "metrics":  # each node has its own sandboxes' latest samples
        return Merged(200, {"sandboxes": {k: v for a in ok
                                          for k, v in a.json()["sandboxes"].items()}}, [])
    if kind == "templates":
        seen: dict[str, object] = {}
        for a in ok:
            for t in a.json():
                seen.setdefault(str(t.get("templateID")), t)
        return Merged(200, list(seen.values()), [])
    return _merge_paged(kind, query, ok)


def _merge_paged(kind: str, query: bytes, answers: Sequence[Answer]) -> Merged:
    params = parse_qs(query.decode("latin-1"))
    ascending = kind == "sandboxes_v2" and (params.get("order") or [""])[0] == "asc"
    limit = int((params.get("limit") or ["100"])[0])  # the nodes accepted it: valid
    rows: list[tuple[tuple[int, str], str, object]] = []
    more = False
    for a in answers:
        items = a.json()
        raw = (a.header(wire.CURSORS_HEADER.encode()) or b"").decode()
        tokens = raw.split(",") if raw else []
        if len(tokens) != len(items):
            return Merged(502, {"code": 502, "message": "a node listed items without cursors "
                                "(is it older than the gateway?)"}, [])  # fmt: skip
        for token, item in zip(tokens, items, strict=True):
            rows.append((_decode(token), token, item))
        more = more or a.header(_NEXT) is not None
    rows.sort(key=lambda r: r[0], reverse=not ascending)
    page = rows[:limit]
    more = more or len(rows) > limit
    headers = [(_NEXT, page[-1][1].encode())] if more and page else []
    return Merged(200, [r[2] for r in page], headers)


def _decode(token: str) -> tuple[int, str]:
    cursor = decode_cursor(token)
    assert cursor is not None
    return cursor


def body_bytes(m: Merged) -> bytes:
    return json.dumps(m.body, separators=(",", ":")).encode()


async def answer(links: NodeLinks, nodes: list[NodeRecord], kind: str, scope: dict[str, Any],
                 send: Any, headers: list[tuple[bytes, bytes]]) -> str:  # fmt: skip
    """Asks every node and answers with the merged listing; the outcome's label."""
    target = target_of(scope, scope["path"].encode())
    answers = await call_all(links, nodes, "GET", target, headers)
    merged = merge(kind, scope.get("query_string", b""), answers)
    data = body_bytes(merged)
    await send({"type": "http.response.start", "status": merged.status, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()), *merged.headers]})  # fmt: skip
    await send({"type": "http.response.body", "body": data})
    return "ok" if merged.status == 200 else f"status_{merged.status}"
