"""Team limits across a cluster, through a gateway in front of two real nodes (fake
runtime) with a real etcd: creates and resumes are placed under the team's limits; forks
and a sandbox woken by traffic hold their places (`cluster/team_holds.py`). Each case is
one a node alone would admit (it runs fewer of the team than the limit)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from tests.support.etcd import EtcdCluster

from .test_gateway import KEY, Cluster, _create, cluster


async def _team_key(c: Cluster, name: str, max_sandboxes: int) -> str:
    """A key of a new team limited to `max_sandboxes`, once the gateway knows it."""
    node = f"http://127.0.0.1:{c.nodes[0].config.port}"
    async with httpx.AsyncClient(base_url=node, headers={"X-API-Key": KEY}) as admin:
        r = await admin.post("/admin/teams", json={"name": name, "maxSandboxes": max_sandboxes})
        assert r.status_code == 201, r.text
        key = (await admin.post("/admin/keys", json={"team": name})).json()["key"]
    for _ in range(100):  # the gateway's view of the teams follows etcd's watch
        if c.gateway.teams is not None and c.gateway.teams.principal(key) is not None:
            return key
        await asyncio.sleep(0.02)
    raise AssertionError("the gateway never saw the team's key")


async def _eventually(call: Any, status: int) -> httpx.Response:
    """The nodes' bindings rounds write what a pause or kill freed within a second or so."""
    for _ in range(100):
        r = await call()
        if r.status_code == status:
            return r
        await asyncio.sleep(0.05)
    return r


async def test_a_teams_limit_holds_across_the_cluster_with_429_not_to_retry(
    tmp_path: Path, one: EtcdCluster
) -> None:
    """maxSandboxes=2 over two nodes: each node alone would take a second one (it runs one),
    so the third create's 429 comes from the placement's count of the whole team."""
    async with cluster(tmp_path, one) as c, c.api() as api:
        key = await _team_key(c, "red", 2)
        async with httpx.AsyncClient(base_url=c.origin, headers={"X-API-Key": key},
                                     timeout=30) as red:  # fmt: skip
            a, b = await _create(red), await _create(red)
            assert {c.holder(a["sandboxID"]), c.holder(b["sandboxID"])} == {0, 1}
            r = await red.post("/sandboxes", json={"templateID": "base"})
            assert r.status_code == 429, r.text
            assert r.headers["should-retry"] == "false" and "retry-after" not in r.headers
            assert "team red may run 2 sandboxes at once and runs 2 across the cluster" in (
                r.json()["message"])
            assert (await _create(api))["sandboxID"]  # the default team is not held back
            assert (await red.delete(f"/sandboxes/{a['sandboxID']}")).status_code == 204
            for _ in range(100):  # the node's kill gives the team's place back
                r = await red.post("/sandboxes", json={"templateID": "base"})
                if r.status_code == 201:
                    break
                await asyncio.sleep(0.05)
            assert r.status_code == 201, r.text


async def test_a_resume_is_placed_under_its_teams_limit(tmp_path: Path, one: EtcdCluster) -> None:
    """maxSandboxes=1: a paused sandbox holds nothing, so another may run; resuming the
    first is then refused (429, not to retry) through the gateway, wherever the running one
    is, and admitted once that one is gone."""
    async with cluster(tmp_path, one) as c:
        key = await _team_key(c, "solo", 1)
        async with httpx.AsyncClient(base_url=c.origin, headers={"X-API-Key": key},
                                     timeout=30) as solo:  # fmt: skip
            a = (await _create(solo))["sandboxID"]
            assert (await solo.post(f"/sandboxes/{a}/pause")).status_code == 204
            r = await _eventually(lambda: solo.post("/sandboxes", json={
                "templateID": "base", "timeout": 300}), 201)  # fmt: skip
            assert r.status_code == 201, r.text
            b = r.json()["sandboxID"]
            for path in ("resume", "connect"):
                r = await solo.post(f"/sandboxes/{a}/{path}", json={"timeout": 60})
                assert r.status_code == 429 and r.headers["should-retry"] == "false", r.text
                assert "team solo may run 1 sandboxes at once" in r.json()["message"]
            assert (await solo.delete(f"/sandboxes/{b}")).status_code == 204
            r = await _eventually(lambda: solo.post(f"/sandboxes/{a}/resume",
                                                    json={"timeout": 60}), 201)  # fmt: skip
            assert r.status_code == 201, r.text




async def test_a_fork_holds_its_childrens_places_across_the_cluster(
    tmp_path: Path, one: EtcdCluster
) -> None:
    """maxSandboxes=2, one running on each node: a fork of one child would be the team's
    third (its node alone runs one), so it is refused until the other one is gone."""
    async with cluster(tmp_path, one) as c:
        key = await _team_key(c, "red", 2)
        async with httpx.AsyncClient(base_url=c.origin, headers={"X-API-Key": key},
                                     timeout=30) as red:  # fmt: skip
            a, b = await _create(red), await _create(red)
            assert {c.holder(a["sandboxID"]), c.holder(b["sandboxID"])} == {0, 1}
            r = await red.post(f"/sandboxes/{b['sandboxID']}/fork", json={"count": 1})
            assert r.status_code == 429 and r.headers["should-retry"] == "false", r.text
            assert "cannot fork 1: team red may run 2 sandboxes at once and runs 2 across " \
                "the cluster" in r.json()["message"]
            assert (await red.delete(f"/sandboxes/{a['sandboxID']}")).status_code == 204
            r = await _eventually(lambda: red.post(f"/sandboxes/{b['sandboxID']}/fork",
                                                   json={"count": 1}), 201)  # fmt: skip
            assert r.status_code == 201, r.text
            kid = r.json()[0]["sandbox"]["sandboxID"]
            assert c.holder(kid) == c.holder(b["sandboxID"])
            # the child counts like any sandbox of the team: the next create is refused
            r = await _eventually(lambda: red.post("/sandboxes", json={"templateID": "base"}),
                                  429)  # fmt: skip
            assert r.status_code == 429, r.text


async def test_a_sandbox_woken_by_traffic_holds_its_place(
    tmp_path: Path, one: EtcdCluster
) -> None:
    """maxSandboxes=1: with another of the team running on the other node, traffic to a
    paused autoResume sandbox gets 429 (it stays paused), and wakes it once that one is
    gone."""
    async with cluster(tmp_path, one) as c:
        key = await _team_key(c, "solo", 1)
        async with httpx.AsyncClient(base_url=c.origin, headers={"X-API-Key": key},
                                     timeout=30) as solo:  # fmt: skip
            a = await _create(solo, autoPause=True, autoResume={"enabled": True})
            sid = a["sandboxID"]
            assert (await solo.post(f"/sandboxes/{sid}/pause")).status_code == 204
            other = c.nodes[1 - c.holder(sid)]
            # The other one is made on the other node directly: no placement counts it,
            # the node's bindings round does.
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{other.config.port}",
                                         headers={"X-API-Key": key}) as direct:  # fmt: skip
                b = await _create(direct)
            traffic = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983",
                       "X-Access-Token": a["envdAccessToken"]}  # fmt: skip
            r = await _eventually(lambda: solo.get("/health", headers=traffic), 429)
            assert r.status_code == 429, r.text
            assert "team solo may run 1 sandboxes at once" in r.json()["message"]
            assert (await solo.get(f"/sandboxes/{sid}")).json()["state"] == "paused"
            assert (await solo.delete(f"/sandboxes/{b['sandboxID']}")).status_code == 204
            r = await _eventually(lambda: solo.get("/health", headers=traffic), 502)
            assert r.status_code == 502, r.text  # woken; nothing listens in a fake VM
            assert (await solo.get(f"/sandboxes/{sid}")).json()["state"] == "running"
