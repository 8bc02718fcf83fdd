"""The gateway's admin routes for the cluster's nodes (cluster/gateway/admin.py) in front of
two real nodes (fake runtime) and a real etcd: the listing, drain and undrain as placements
see them, what a key that is not an admin's gets, and CORS for the gateway's console."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from aenv.api.console_cors import ConsoleCors
from tests.integration.cluster.test_gateway import KEY, _create, cluster
from tests.support.etcd import EtcdCluster

CONSOLE = "http://127.0.0.1:18102"


async def _until(cond, what: str, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(what)


async def test_nodes_are_listed_drained_and_undrained_for_admin_keys(
        tmp_path: Path, one: EtcdCluster) -> None:  # fmt: skip
    async with cluster(tmp_path, one) as c, c.api() as api:
        listed = (await api.get("/admin/nodes")).json()
        assert [n["name"] for n in listed] == ["n0", "n1"]
        assert all(n["reachable"] and n["state"] == "ready" for n in listed)
        assert listed[0]["capacity"]["maxSandboxes"] > 0 and "usage" in listed[0]

        r = await api.post("/admin/nodes/n1/drain", json={"pause": False})
        assert r.status_code == 204
        assert c.gateway.members is not None
        members = c.gateway.members
        await _until(lambda: members.nodes["n1"].draining, "n1 never showed as draining")
        assert [n["state"] for n in (await api.get("/admin/nodes")).json()] == \
            ["ready", "draining"]
        made = [await _create(api) for _ in range(3)]
        assert [c.holder(s["sandboxID"]) for s in made] == [0, 0, 0]  # none on n1
        assert (await api.delete("/admin/nodes/n1/drain")).status_code == 204
        await _until(lambda: not members.nodes["n1"].draining, "n1 never took sandboxes again")
        assert c.holder((await _create(api))["sandboxID"]) == 1  # the least loaded again

        assert (await api.delete("/admin/nodes/n1/drain")).json() == {
            "code": 404, "message": "node 'n1' is not draining"}
        r = await api.post("/admin/nodes/nope/drain")
        assert r.status_code == 404 and r.json()["message"] == "no node 'nope' is registered"
        r = await api.post("/admin/nodes/n0/drain", content=b'{"pause": "yes"}')
        assert r.status_code == 400
        assert (await api.get("/admin/nodes", headers={"X-API-Key": "nope"})).status_code == 401
        for method, path in (("GET", "/admin/nodes/n0/drain"), ("DELETE", "/admin/nodes")):
            r = await api.request(method, path)
            assert r.status_code == 405 and r.json()["code"] == 405, (method, path)

        team = (await api.post("/admin/teams", json={"name": "not-admins"})).json()
        key = (await api.post("/admin/keys", json={"team": team["teamID"]})).json()["key"]
        await asyncio.sleep(0.5)  # the gateway's view of the teams' keys follows etcd
        r = await api.get("/admin/nodes", headers={"X-API-Key": key})
        assert r.status_code == 403 and "not an admin key" in r.json()["message"]
        assert (await api.post("/admin/nodes/n0/drain",
                               headers={"X-API-Key": key})).status_code == 403  # fmt: skip
        assert not members.nodes["n0"].draining

        # The overview through the gateway is the cluster's: both nodes' sandboxes.
        joined = (await api.get("/overview")).json()
        assert joined["team"]["now"]["running"] == 4 and joined["node"]["now"]["running"] == 4
        assert joined["node"]["maxSandboxes"] == sum(
            n.capacity.max_sandboxes for n in members.nodes.values())
        assert (await api.get("/overview", headers={"X-API-Key": key})).json()["node"] is None
        for s in (await api.get("/v2/sandboxes")).json():
            await api.delete(f"/sandboxes/{s['sandboxID']}")


async def test_the_gateway_answers_cors_for_its_console(tmp_path: Path, one: EtcdCluster) -> None:
    async with cluster(tmp_path, one) as c:
        c.gateway.cors = ConsoleCors([CONSOLE])
        async with httpx.AsyncClient(base_url=c.origin) as http:
            def preflight(origin: str) -> dict[str, str]:
                return {"Origin": origin, "Access-Control-Request-Method": "GET",
                        "Access-Control-Request-Headers": "x-api-key"}  # fmt: skip

            ok = await http.options("/admin/nodes", headers=preflight(CONSOLE))
            assert ok.status_code == 204
            assert ok.headers["access-control-allow-origin"] == CONSOLE
            bad = await http.options("/admin/nodes", headers=preflight("http://evil.test"))
            assert "access-control-allow-origin" not in bad.headers
            listed = await http.get("/v2/sandboxes", headers={"X-API-Key": KEY,
                                                              "Origin": CONSOLE})  # fmt: skip
            assert listed.status_code == 200
            assert listed.headers["access-control-allow-origin"] == CONSOLE
