"""The gateway (issue 14, item 1) in front of two real nodes (fake runtime: no VMs) under
real uvicorns, with a real etcd: placement on create, routing of the control and data
planes by binding, merged listings with stable pages, signed /files URLs, and creates a
node refuses giving their reservation back. The real-VM path, through the unmodified SDK,
is tests/e2e/test_gateway.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from e2b.api.client.api.sandboxes import get_sandboxes_metrics
from e2b.api.client.client import AuthenticatedClient
from e2b.api.client.models import SandboxesWithMetrics
from websockets.asyncio.client import connect

from aenv.api.app import Node
from aenv.api.proxy import file_signature
from aenv.cluster import wire
from aenv.cluster.etcd import Etcd
from aenv.cluster.gateway.app import Gateway
from aenv.cluster.placement import PlacementRequest, binding, place, reservations
from aenv.config import Config
from aenv.orchestrator.fake import FakeRuntime
from tests.support.asgi import serve
from tests.support.etcd import EtcdCluster, free_port

KEY = "gw-test-key"
TOKEN = "gw-test-cluster-token"
DOMAIN = "gw.test"


def _config(tmp: Path, etcd: EtcdCluster, prefix: str, **kw: Any) -> Config:
    cluster = {"etcd_endpoints": etcd.endpoints, "prefix": prefix, "token": TOKEN,
               "lease_ttl_s": 3, **kw.pop("cluster", {})}  # fmt: skip
    return Config.model_validate({
        "data_dir": tmp, "runtime": "fake", "api_key": KEY, "ttl_sweep_interval_s": 0.05,
        "metrics_interval_s": 0.2, "transition_wait_s": 5, "cluster": cluster, **kw})  # fmt: skip


@dataclass
class Cluster:
    nodes: list[Node]
    gateway: Gateway
    origin: str
    prefix: str
    etcd: Etcd

    def api(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.origin, headers={"X-API-Key": KEY}, timeout=30)

    def holder(self, sandbox_id: str) -> int:
        """Which node's store holds the sandbox (index), or -1."""
        for i, n in enumerate(self.nodes):
            if n.orchestrator.store.get(sandbox_id) is not None:
                return i
        return -1


@contextlib.asynccontextmanager
async def cluster(tmp: Path, etcd: EtcdCluster, n: int = 2, **node_kw: Any
                  ) -> AsyncIterator[Cluster]:  # fmt: skip
    prefix = f"/gw{os.urandom(3).hex()}/"
    client = Etcd(etcd.endpoints)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(client.aclose)
        nodes = []
        for i in range(n):
            port = free_port()
            cfg = _config(tmp / f"n{i}", etcd, prefix, port=port, host="127.0.0.1",
                          cluster={"node_name": f"n{i}"}, **node_kw)  # fmt: skip
            node = Node(cfg, FakeRuntime())
            await node.start()
            stack.push_async_callback(node.close)
            await stack.enter_async_context(serve(node, port))
            nodes.append(node)
        gw = Gateway(_config(tmp / "gw", etcd, prefix, domain=DOMAIN))
        await gw.start()
        stack.push_async_callback(gw.close)
        port = await stack.enter_async_context(serve(gw))
        assert gw.members is not None
        for _ in range(100):
            if len(gw.members.nodes) == n:
                break
            await asyncio.sleep(0.05)
        assert len(gw.members.nodes) == n
        yield Cluster(nodes, gw, f"http://127.0.0.1:{port}", prefix, client)


class Upstream:
    """A stand-in for a sandbox's port (the fake runtime's slots are 127.0.0.1)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.accept"})
            while (msg := await receive())["type"] == "websocket.receive":
                await send({"type": "websocket.send", "text": "echo:" + (msg.get("text") or "")})
            return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        self.seen.append({"path": scope["raw_path"].decode(),
                          "headers": {k.decode(): v.decode() for k, v in scope["headers"]}})
        data = b"up:" + scope["raw_path"] + b":" + body
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


async def _create(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await api.post("/sandboxes", json={"templateID": "base", "timeout": 300, **body})
    assert r.status_code == 201, r.text
    return r.json()


async def test_creates_are_placed_on_both_nodes_and_routed_back(
    tmp_path: Path, one: EtcdCluster
) -> None:
    async with cluster(tmp_path, one) as c, c.api() as api:
        made = [await _create(api) for _ in range(4)]
        where = [c.holder(s["sandboxID"]) for s in made]
        assert sorted(where) == [0, 0, 1, 1], where  # the least loaded first: spread
        for s, i in zip(made, where, strict=True):
            b = await binding(c.etcd, c.prefix, s["sandboxID"])
            assert b is not None and b.node == f"n{i}"
            r = await api.get(f"/sandboxes/{s['sandboxID']}")
            assert r.status_code == 200 and r.json()["sandboxID"] == s["sandboxID"]
        r = await api.post(f"/sandboxes/{made[0]['sandboxID']}/timeout", json={"timeout": 60})
        assert r.status_code == 204
        for s in made:
            assert (await api.delete(f"/sandboxes/{s['sandboxID']}")).status_code == 204
            assert (await api.get(f"/sandboxes/{s['sandboxID']}")).status_code == 404
        r = await api.get("/sandboxes/nosuchsandbox")
        assert r.status_code == 404 and r.json()["code"] == 404
        assert (await api.get("/health")).json()["nodes"] == 2


async def test_listings_merge_every_node_with_stable_pages(
    tmp_path: Path, one: EtcdCluster
) -> None:
    async with cluster(tmp_path, one) as c, c.api() as api:
        ids = [(await _create(api, metadata={"k": "v"}))["sandboxID"] for _ in range(5)]
        assert {c.holder(i) for i in ids} == {0, 1}
        assert sorted(s["sandboxID"] for s in (await api.get("/sandboxes")).json()) == sorted(ids)
        for order in ("desc", "asc"):
            seen: list[str] = []
            token = None
            for _ in range(10):
                params = {"limit": 2, "order": order, **({"nextToken": token} if token else {})}
                r = await api.get("/v2/sandboxes", params=params)
                assert r.status_code == 200, r.text
                page = r.json()
                assert len(page) <= 2
                seen += [s["sandboxID"] for s in page]
                token = r.headers.get("x-next-token")
                if token is None:
                    break
            assert sorted(seen) == sorted(ids) and len(seen) == 5, order
            # One order over both nodes: as the creates were made (newest first by default).
            assert seen == (ids if order == "asc" else ids[::-1]), order
        r = await api.get("/v2/sandboxes", params={"state": "bogus"})
        assert r.status_code == 400 and r.json()["code"] == 400
        templates = (await api.get("/templates")).json()
        assert [t["templateID"] for t in templates] == ["base"]
        # Metrics of sandboxes on both nodes at once, through the SDK's generated client.
        sdk = AuthenticatedClient(base_url=c.origin, token=KEY, prefix="",
                                  auth_header_name="X-API-Key")  # fmt: skip
        async with sdk:
            got = await get_sandboxes_metrics.asyncio(client=sdk, sandbox_ids=[*ids, "nope"])
        assert isinstance(got, SandboxesWithMetrics) and set(got.sandboxes) == set(ids), got
        bad = httpx.AsyncClient(base_url=c.origin, headers={"X-API-Key": "wrong"})
        async with bad:
            assert (await bad.get("/v2/sandboxes")).status_code == 401
            assert (await bad.post("/sandboxes", json={"templateID": "base"})).status_code == 401
        assert sum(r.sandboxes for r in (await reservations(c.etcd, c.prefix)).values()) == 5
        for i in ids:
            await api.delete(f"/sandboxes/{i}")


async def test_sandbox_traffic_routes_by_header_path_and_host(
    tmp_path: Path, one: EtcdCluster
) -> None:
    up = Upstream()
    async with serve(up) as up_port, cluster(tmp_path, one) as c, c.api() as api:
        sids = [(await _create(api))["sandboxID"] for _ in range(2)]
        assert {c.holder(s) for s in sids} == {0, 1}
        async with httpx.AsyncClient(base_url=c.origin, timeout=30) as raw:
            for sid in sids:
                route = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(up_port)}
                r = await raw.post("/a/b?q=1", content=b"hi", headers=route)
                assert r.status_code == 200 and r.content == b"up:/a/b:hi", r.text
                r = await raw.get(f"/proxy/{sid}/{up_port}/p/q")
                assert r.status_code == 200 and r.content == b"up:/p/q:"
                r = await raw.get("/h", headers={"Host": f"{up_port}-{sid}.{DOMAIN}"})
                assert r.status_code == 200 and r.content == b"up:/h:"
            # What the sandbox sees carries nothing of the cluster's own.
            assert not any(k.startswith("x-aenv") for s in up.seen for k in s["headers"])
            r = await raw.get("/x", headers={"E2b-Sandbox-Id": "nosuch", "E2b-Sandbox-Port": "1"})
            assert r.status_code == 502 and "was not found" in r.json()["message"]
        ws_url = c.origin.replace("http", "ws") + f"/proxy/{sids[1]}/{up_port}/ws"
        async with connect(ws_url) as ws:
            await ws.send("hello")
            assert await ws.recv() == "echo:hello"
        for s in sids:
            await api.delete(f"/sandboxes/{s}")


async def test_a_signed_files_url_finds_its_sandbox_on_its_node(
    tmp_path: Path, one: EtcdCluster
) -> None:
    async with cluster(tmp_path, one) as c, c.api() as api:
        made = [await _create(api) for _ in range(2)]
        async with httpx.AsyncClient(base_url=c.origin, timeout=30) as raw:
            for s in made:
                sig = file_signature("/tmp/x", "read", "user", s["envdAccessToken"], None)
                r = await raw.get("/files", params={"path": "/tmp/x", "username": "user",
                                                    "signature": sig})  # fmt: skip
                # Routed to its sandbox: the fake runtime's slot has no agent listening.
                assert r.status_code == 502 and r.json().get("sandboxId") == s["sandboxID"], r.text
            r = await raw.get("/files", params={"path": "/tmp/x", "username": "user",
                                                "signature": "v1_bogus"})  # fmt: skip
            assert r.status_code == 401
        for s in made:
            await api.delete(f"/sandboxes/{s['sandboxID']}")


async def test_refused_creates_give_their_reservation_back_and_full_is_429(
    tmp_path: Path, one: EtcdCluster
) -> None:
    async with cluster(tmp_path, one, max_sandboxes=1) as c, c.api() as api:
        r = await api.post("/sandboxes", json={"templateID": "nope"})
        assert r.status_code == 404, r.text
        r = await api.post("/sandboxes", json={"templateID": "base", "memoryMB": 1})
        assert r.status_code == 400, r.text
        r = await api.post("/sandboxes", content=b"{not json")
        assert r.status_code == 400, r.text
        assert sum(x.sandboxes for x in (await reservations(c.etcd, c.prefix)).values()) == 0
        a, b = await _create(api), await _create(api)
        assert {c.holder(a["sandboxID"]), c.holder(b["sandboxID"])} == {0, 1}
        r = await api.post("/sandboxes", json={"templateID": "base"})
        assert r.status_code == 429 and r.headers["retry-after"], r.text
        # Only a gateway (with the cluster token) names the id of a create.
        node = c.nodes[0]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.config.port}",
                                     headers={"X-API-Key": KEY}) as direct:  # fmt: skip
            r = await direct.post("/sandboxes", json={"templateID": "base"},
                                  headers={"x-aenv-sandbox-id": "mine"})
            assert r.status_code == 403, r.text
            r = await direct.get("/cluster/v1/sandboxes/" + a["sandboxID"])
            assert r.status_code == 404  # the internal routes need the token
            # With it, a malformed fork-children body is a 400 with a message, never a 500.
            good = {"snapshot": "fork-x-1", "source": {"node": "n0", "url": "http://n0"}}
            for bad in (b"{not json", b"[]", json.dumps({**good, "children": 3}).encode(),
                        json.dumps({"snapshot": "s", "source": {}, "children": []}).encode(),
                        json.dumps({**good, "children": [{"sandbox_id": "k"}]}).encode()):
                r = await direct.post("/cluster/v1/fork-children", content=bad,
                                      headers={wire.TOKEN_HEADER: TOKEN})  # fmt: skip
                assert r.status_code == 400, (bad, r.text)
                assert r.json()["code"] == 400 and "expected" in r.json()["message"]
        for s in (a, b):
            await api.delete(f"/sandboxes/{s['sandboxID']}")


async def test_an_unbound_sandbox_is_found_by_asking_and_a_lost_nodes_is_gone(
    tmp_path: Path, one: EtcdCluster
) -> None:
    async with cluster(tmp_path, one) as c, c.api() as api:
        node = c.nodes[1]
        assert node.membership is not None
        await node.membership.bindings.stop()  # its bindings now lag: as in the first second
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.config.port}",
                                     headers={"X-API-Key": KEY}) as direct:  # fmt: skip
            r = await direct.post("/sandboxes", json={"templateID": "base", "timeout": 300})
            assert r.status_code == 201
            sid = r.json()["sandboxID"]
        assert await binding(c.etcd, c.prefix, sid) is None
        r = await api.get(f"/sandboxes/{sid}")
        assert r.status_code == 200 and r.json()["sandboxID"] == sid
        # Its node leaves the membership (lost): its sandboxes answer as missing ones.
        await node.membership.registration.stop()
        assert c.gateway.members is not None
        for _ in range(100):
            if "n1" not in c.gateway.members.nodes:
                break
            await asyncio.sleep(0.05)
        assert (await api.get(f"/sandboxes/{sid}")).status_code == 404
        r = await api.get("/x", headers={"E2b-Sandbox-Id": sid})
        assert r.status_code == 502 and "was not found" in r.json()["message"]
        await node.orchestrator.kill(sid)


async def test_an_idempotency_key_makes_one_sandbox_however_often_and_wherever_it_is_tried(
    tmp_path: Path, one: EtcdCluster
) -> None:
    async with cluster(tmp_path, one) as c, c.api() as api:
        body = {"templateID": "base", "timeout": 300, "metadata": {"try": "k1"}}
        key = {"Idempotency-Key": "k-one"}
        first = await api.post("/sandboxes", json=body, headers=key)
        assert first.status_code == 201, first.text
        again = await api.post("/sandboxes", json=body, headers=key)
        assert again.status_code == 201 and again.json()["sandboxID"] == first.json()["sandboxID"]
        assert again.json()["envdAccessToken"] == first.json()["envdAccessToken"]
        # At once, from many tries: still one.
        body2 = {**body, "metadata": {"try": "k2"}}
        rs = await asyncio.gather(*(api.post("/sandboxes", json=body2,
                                             headers={"Idempotency-Key": "k-two"})
                                    for _ in range(6)))  # fmt: skip
        assert all(r.status_code == 201 for r in rs), [r.text for r in rs]
        assert len({r.json()["sandboxID"] for r in rs}) == 1
        r = await api.post("/sandboxes", json={**body, "timeout": 5}, headers=key)
        assert r.status_code == 409 and "different request" in r.json()["message"]
        # A try that died after claiming and placing (a gateway killed mid-request): the
        # next try creates the sandbox that claim named, on the node it was placed on.
        assert c.gateway.idem is not None and c.gateway.members is not None
        gone_key = c.gateway.idem.key(KEY, "k-three")
        body3 = {**body, "metadata": {"try": "k3"}}
        raw = json.dumps(body3).encode()
        claim, mine = await c.gateway.idem.claim(gone_key, raw)
        assert mine
        placed = await place(c.etcd, c.prefix, list(c.gateway.members.nodes.values()),
                             PlacementRequest(claim.sandbox_id, 512, "base"))
        r = await api.post("/sandboxes", content=raw, headers={"Idempotency-Key": "k-three",
                                                               "Content-Type": "application/json"})
        assert r.status_code == 201 and r.json()["sandboxID"] == claim.sandbox_id, r.text
        assert c.holder(claim.sandbox_id) == int(placed.name[1:])
        # A create the node refused lets the key go: the next try is a new attempt.
        r = await api.post("/sandboxes", json={**body, "timeout": 10**9},
                           headers={"Idempotency-Key": "k-four"})
        assert r.status_code == 400, r.text
        r = await api.post("/sandboxes", json=body, headers={"Idempotency-Key": "k-four"})
        assert r.status_code == 201, r.text
        listed = (await api.get("/sandboxes")).json()
        assert len(listed) == 4, listed  # k-one, k-two, k-three, k-four: one each
        for s in listed:
            await api.delete(f"/sandboxes/{s['sandboxID']}")
        r = await api.post("/sandboxes", json=body, headers=key)
        assert r.status_code == 409 and "no longer exists" in r.json()["message"], r.text
        for _ in range(100):  # the nodes' next rounds, kicked by the kills
            if sum(x.sandboxes for x in (await reservations(c.etcd, c.prefix)).values()) == 0:
                break
            await asyncio.sleep(0.05)
        assert sum(x.sandboxes for x in (await reservations(c.etcd, c.prefix)).values()) == 0
