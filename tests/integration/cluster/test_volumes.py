"""A cluster's volumes (`cluster/volumes.py`): records in a real etcd, data on the directory
every node mounts (here one local directory for two real nodes on the fake runtime, behind a
gateway). A volume made through one is known and readable at every node, its name is taken
once per team, another team gets 404, a sandbox on one node that mounts it keeps a delete at
another from taking it, and a joining node brings its own. Real VMs across nodes:
tests/e2e/test_cluster_snapshots.py."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import httpx

from aenv.cluster.etcd import Etcd
from aenv.cluster.volumes import EtcdVolumes
from aenv.volumes.store import VolumeStore
from tests.support.etcd import EtcdCluster

from .test_gateway import KEY, cluster
from .test_gateway_teams import _team_key


async def _soon(call, status: int) -> httpx.Response:  # type: ignore[no-untyped-def]
    for _ in range(100):  # another node's view follows etcd's watch
        r = await call()
        if r.status_code == status:
            return r
        await asyncio.sleep(0.02)
    return r


async def test_a_volume_is_the_whole_clusters(tmp_path: Path, one: EtcdCluster) -> None:
    shared = tmp_path / "shared-volumes"
    async with cluster(tmp_path, one, volumes_path=str(shared)) as c, c.api() as api:
        r = await api.post("/volumes", json={"name": "data"})
        assert r.status_code == 201, r.text
        vid, token = r.json()["volumeID"], r.json()["token"]
        assert (shared / vid).is_dir()
        bearer = {"Authorization": f"Bearer {token}"}
        n0, n1 = (httpx.AsyncClient(base_url=f"http://127.0.0.1:{n.config.port}",
                                    headers={"X-API-Key": KEY}) for n in c.nodes)  # fmt: skip
        async with n0, n1:
            for n in (n0, n1):  # every node knows it, by id and by name
                r = await _soon(lambda n=n: n.get("/volumes/data"), 200)
                assert r.status_code == 200 and r.json()["volumeID"] == vid, r.text
                assert [v["name"] for v in (await n.get("/volumes")).json()] == ["data"]
            r = await n0.put(f"/volumecontent/{vid}/file", params={"path": "/a.txt"},
                             content=b"written at n0", headers=bearer)  # fmt: skip
            assert r.status_code < 300, r.text
            r = await n1.get(f"/volumecontent/{vid}/file", params={"path": "/a.txt"},
                             headers=bearer)  # fmt: skip
            assert r.status_code == 200 and r.content == b"written at n0"
            r = await n1.post("/volumes", json={"name": "data"})
            assert r.status_code == 409 and "exists" in r.json()["message"]
            # another team: not found, and the name is free for it
            red = await _team_key(c, "red", 5)
            async with httpx.AsyncClient(base_url=c.origin, headers={"X-API-Key": red}) as rc:
                assert (await rc.get("/volumes/data")).status_code == 404
                assert (await rc.get(f"/volumes/{vid}")).status_code == 404
                assert (await rc.post("/volumes", json={"name": "data"})).status_code == 201
            # mounted by a sandbox of n1: a delete at n0 is refused, naming it
            r = await n1.post("/sandboxes", json={"templateID": "base", "volumeMounts": [
                {"name": "data", "path": "/mnt/data"}]})  # fmt: skip
            assert r.status_code == 201, r.text
            sid = r.json()["sandboxID"]
            r = await n0.delete(f"/volumes/{vid}")
            assert r.status_code == 409 and sid in r.json()["message"], r.text
            assert (await n1.delete(f"/sandboxes/{sid}")).status_code == 204
            assert (await n0.delete(f"/volumes/{vid}")).status_code == 204
            assert not (shared / vid).exists()
            r = await _soon(lambda: n1.get(f"/volumes/{vid}"), 404)
            assert r.status_code == 404


async def test_a_joining_nodes_volumes_come_with_their_ids(etcd: Etcd, tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "node.db", isolation_level=None)
    local = VolumeStore(db, tmp_path / "vols")
    mine = await local.create("mine", "default")
    clash = await local.create("taken", "default")
    other = EtcdVolumes(etcd, f"/v{tmp_path.name[-6:]}/", tmp_path / "vols")
    await other.start()
    try:
        theirs = await other.create("taken", "default")  # the cluster's own, same name
        assert await other.carry(local.all()) == ["taken"]
        assert await other.get("mine", "default") == mine
        assert await other.get(mine.volume_id, None) == mine  # the content API's lookup
        assert (await other.get("taken", "default")).volume_id == theirs.volume_id
        assert clash.volume_id != theirs.volume_id
        assert await other.carry(local.all()) == ["taken"]  # again: nothing new
        assert [v.name for v in await other.list("default")] == ["mine", "taken"]
    finally:
        await other.stop()
        db.close()
