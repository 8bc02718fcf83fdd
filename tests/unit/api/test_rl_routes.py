"""The RL plane's routes on an in-process node (fake runtime, no VMs): groups by key,
batching of on-demand members, teams, leases that lapse. Real VMs: tests/e2e/test_rl.py."""

from __future__ import annotations

import asyncio
import time

import httpx

from aenv.api.app import Node


async def _make_source(client: httpx.AsyncClient) -> str:
    r = await client.post("/sandboxes", json={"templateID": "base", "timeout": 300})
    assert r.status_code == 201, r.text
    return r.json()["sandboxID"]


async def _live(client: httpx.AsyncClient) -> set[str]:
    return {s["sandboxID"] for s in (await client.get("/v2/sandboxes")).json()}


async def test_one_group_per_key_members_forked_ahead_then_in_batches(
        client: httpx.AsyncClient, node: Node) -> None:  # fmt: skip
    src = await _make_source(client)
    body = {"key": "p1", "source": {"sandbox": src}, "n": 3, "lease_s": 60}
    got = await asyncio.gather(*(client.post("/rl/groups", json=body) for _ in range(10)))
    assert all(r.status_code == 201 for r in got), [r.text for r in got]
    docs = [r.json() for r in got]
    assert len({d["groupID"] for d in docs}) == 1
    assert sum(d["created"] for d in docs) == 1
    assert sorted(d["member"]["index"] for d in docs) == list(range(10))
    gid = docs[0]["groupID"]
    view = (await client.get(f"/rl/groups/{gid}")).json()
    assert view["joins"] == 10 and all(m["taken"] for m in view["members"])
    assert {m["state"] for m in view["members"]} == {"running"}
    # The source is not a member, and it is untouched; the start state is the group's own.
    assert src not in {m["sandboxID"] for m in view["members"]}
    assert (await client.get(f"/sandboxes/{src}")).json()["state"] == "running"
    # Another key is another group; another team sees none of it.
    other = await client.post("/rl/groups", json={**body, "key": "p2", "n": 0})
    assert other.json()["groupID"] != gid
    r = await client.delete(f"/rl/groups/{gid}")
    assert r.status_code == 204
    assert (await client.get(f"/rl/groups/{gid}")).status_code == 404
    assert await _live(client) == {src, other.json()["member"]["sandboxID"]}
    await client.delete(f"/rl/leases/{other.json()['lease']['leaseID']}")
    assert await _live(client) == {src}
    names = [n for s in (await client.get("/snapshots")).json() for n in s["names"]]
    assert not [n for n in names if n.startswith("rl-")]


async def test_a_lapsed_lease_takes_its_groups_and_sandboxes(client: httpx.AsyncClient) -> None:
    src = await _make_source(client)
    lease = (await client.post("/rl/leases", json={"lease_s": 2})).json()
    lid = lease["leaseID"]
    r = await client.post("/rl/groups", json={"key": "q", "source": {"sandbox": src},
                                              "n": 2, "leaseID": lid})  # fmt: skip
    assert r.status_code == 201, r.text
    extra = await _make_source(client)
    assert (await client.post(f"/rl/leases/{lid}/sandboxes",
                              json={"sandboxID": extra})).status_code == 200  # fmt: skip
    held = (await client.get(f"/rl/leases/{lid}")).json()
    assert held["groups"] == [r.json()["groupID"]] and held["sandboxes"] == [extra]
    for _ in range(3):  # renewed past its first end: alive
        await asyncio.sleep(1)
        assert (await client.post(f"/rl/leases/{lid}")).status_code == 200
    assert len(await _live(client)) == 4
    t0 = time.monotonic()
    while await _live(client) != {src}:
        assert time.monotonic() - t0 < 2 + 5, "the lapsed lease's sandboxes outlived it"
        await asyncio.sleep(0.1)
    assert (await client.post(f"/rl/leases/{lid}")).status_code == 404
    assert (await client.get(f"/rl/groups/{r.json()['groupID']}")).status_code == 404


async def test_a_group_from_another_teams_sandbox_is_refused(client: httpx.AsyncClient,
                                                             node: Node) -> None:
    src = await _make_source(client)
    rec = node.orchestrator.store.get(src)
    assert rec is not None
    node.orchestrator.store.db.execute("UPDATE sandboxes SET team_id = 'other' "
                                       "WHERE sandbox_id = ?", (src,))  # fmt: skip
    r = await client.post("/rl/groups", json={"key": "x", "source": {"sandbox": src}})
    assert r.status_code == 404 and "doesn't exist" in r.json()["message"]
    r = await client.post("/rl/evaluate", json={"sandboxID": src, "cmd": "true"})
    assert r.status_code == 404


async def test_checkpoints_make_a_tree_and_unreferenced_ones_are_collected(
        client: httpx.AsyncClient, node: Node) -> None:  # fmt: skip
    src = await _make_source(client)
    take = lambda sid: client.post(f"/rl/sandboxes/{sid}/checkpoints")  # noqa: E731
    a = (await take(src)).json()
    b = (await take(src)).json()
    assert (a["parent"], b["parent"]) == (None, a["stepID"])
    r = await client.post(f"/rl/sandboxes/{src}/rollback", json={"stepID": a["stepID"]})
    assert r.status_code == 200, r.text
    assert (await client.get(f"/sandboxes/{src}")).json()["state"] == "running"
    c = (await take(src)).json()
    assert c["parent"] == a["stepID"]  # a branch beside b
    kids = (await client.post(f"/rl/checkpoints/{b['stepID']}/fork", json={"count": 2})).json()
    kid_ids = {k["sandbox"]["sandboxID"] for k in kids}
    tree = (await client.get(f"/rl/lineage/{src}")).json()
    assert tree["root"] == a["stepID"]
    nodes = {n["id"]: n["parent"] for n in tree["nodes"]}
    assert nodes == {a["stepID"]: None, b["stepID"]: a["stepID"], c["stepID"]: a["stepID"],
                     src: c["stepID"], **{k: b["stepID"] for k in kid_ids}}
    listed = (await client.get("/snapshots")).json()
    assert not {x["snapshotID"] for x in listed} & {a["snapshotID"], b["snapshotID"]}
    # Pruning b: b and the two sandboxes forked from it.
    gone = (await client.delete(f"/rl/checkpoints/{b['stepID']}")).json()
    assert gone == {"checkpoints": [b["stepID"]], "sandboxes": sorted(kid_ids)}
    assert await _live(client) == {src}
    # No lease: the checkpoints live while their sandbox does.
    assert (await client.delete(f"/sandboxes/{src}")).status_code == 204
    t0 = time.monotonic()
    while (await client.get(f"/rl/lineage/{a['stepID']}")).status_code != 404:
        assert time.monotonic() - t0 < 5, "unreferenced checkpoints were not collected"
        await asyncio.sleep(0.1)
    assert node.rl.checkpoints.of_sandbox(src) == []
