"""The gateway's own answers: `/health`, `/metrics` and, for admin keys, the cluster's nodes
(the console's nodes page; docs/api.md, "Nodes"): `GET /admin/nodes` lists the members as
etcd has them and whether this gateway reaches each now; `POST /admin/nodes/{name}/drain`
(`{"pause": bool}`) and `DELETE` of it drain and undrain, as `aenv node drain|undrain` do
(cluster/draining.py)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

import aenv
from aenv.api.relay import send_json
from aenv.cluster import draining
from aenv.cluster.etcd import Etcd
from aenv.cluster.gateway.nodes import Answer, NodeLinks, call_all
from aenv.cluster.membership import NodeRecord
from aenv.teams.model import Principal

_DRAIN = re.compile(r"^/admin/nodes/([^/]+)/drain$")
MAX_BODY = 4096
NOT_ADMIN = ("this API key is not an admin key: the cluster's nodes are managed with an "
             "admin key")  # fmt: skip


def is_nodes_admin(path: str) -> bool:
    return path == "/admin/nodes" or _DRAIN.match(path) is not None


class NodesAdmin:
    def __init__(self, etcd: Callable[[], Etcd], prefix: str, links: NodeLinks,
                 nodes: Callable[[], list[NodeRecord]]) -> None:  # fmt: skip
        self.etcd = etcd
        self.prefix = prefix
        self.links = links
        self.nodes = nodes

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any,
                     who: Principal | None) -> str:  # fmt: skip
        if who is None:
            await send_json(send, 401, {"code": 401, "message": "Invalid API key"})
            return "unauthorized"
        if not who.admin:
            await send_json(send, 403, {"code": 403, "message": NOT_ADMIN})
            return "forbidden"
        method, path = scope["method"], scope["path"]
        if path == "/admin/nodes" and method == "GET":
            await send_json(send, 200, await self.listing())
            return "ok"
        m = _DRAIN.match(path)
        if m is None or method not in ("POST", "DELETE"):
            await send_json(send, 405, {"code": 405, "message": "Method Not Allowed"})
            return "bad_method"
        name = m.group(1)
        if method == "DELETE":
            if not await draining.undrain(self.etcd(), self.prefix, name):
                await send_json(send, 404, {"code": 404, "message": f"node {name!r} is not "
                                            "draining"})  # fmt: skip
                return "not_found"
            return await _no_content(send)
        pause = await _pause(receive)
        if pause is None:
            await send_json(send, 400, {"code": 400, "message": 'the body is {"pause": '
                                        "true|false}, or none"})  # fmt: skip
            return "bad_body"
        if not await draining.drain(self.etcd(), self.prefix, name, pause):
            await send_json(send, 404, {"code": 404, "message": f"no node {name!r} is "
                                        "registered"})  # fmt: skip
            return "not_found"
        return await _no_content(send)

    async def listing(self) -> list[dict[str, Any]]:
        nodes = self.nodes()
        answers = await call_all(self.links, nodes, "GET", b"/health", [])
        now = time.time()
        return [{
            "name": n.name, "url": n.url, "version": n.version, "accelerator": n.accelerator,
            "state": "draining" if n.draining else "ready",
            "reachable": isinstance(a, Answer) and a.status == 200,
            "capacity": {"maxSandboxes": n.capacity.max_sandboxes,
                         "memoryMB": n.capacity.memory_mib,
                         "budgetMB": n.capacity.budget_mib or n.capacity.memory_mib},
            "usage": {"sandboxes": n.usage.sandboxes, "memoryMB": n.usage.memory_mib,
                      "hotPaused": n.usage.hot_paused, "heldMB": n.usage.held_mib},
            "templates": len(n.templates), "snapshots": len(n.snapshots),
            "updatedSecondsAgo": round(max(now - n.updated_at, 0), 1),
        } for n, a in zip(nodes, answers, strict=True)]  # fmt: skip


async def _pause(receive: Any) -> bool | None:
    """The drain body's `pause` (none: False); None for a body that is not one."""
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if len(body) > MAX_BODY:
            return None
        if not msg.get("more_body", False):
            break
    if not body.strip():
        return False
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict) or set(doc) - {"pause"} or \
            not isinstance(doc.get("pause", False), bool):
        return None
    return bool(doc.get("pause", False))


async def _no_content(send: Any) -> str:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})
    return "ok"


async def own(send: Any, what: str, nodes: int) -> None:
    """`/metrics` (the gateway's own) or `/health`."""
    if what == "metrics":
        data = generate_latest()
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", CONTENT_TYPE_LATEST.encode()),
            (b"content-length", str(len(data)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": data})
        return
    await send_json(send, 200, {"status": "ok", "version": aenv.__version__,
                                "role": "gateway", "nodes": nodes})  # fmt: skip
