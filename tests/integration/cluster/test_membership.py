"""Node membership (`cluster/membership.py`) against a real etcd: a node's record under its
lease, kept alive past the TTL, republished on change, gone on stop or when the node dies,
registered again after its lease expired, and a watching view that follows all of it."""

from __future__ import annotations

import asyncio
import time

from aenv.cluster.etcd import Etcd
from aenv.cluster.membership import Capacity, Members, NodeRecord, Registration, Usage
from tests.support.etcd import EtcdCluster


class FakeNode:
    """What a node reports; the test changes it."""

    def __init__(self, name: str) -> None:
        self.rec = NodeRecord(name=name, url=f"http://{name}:8000", version="0.0.test",
                              capacity=Capacity(max_sandboxes=4, memory_mib=2048))

    def __call__(self) -> NodeRecord:
        return self.rec.model_copy(deep=True)


async def _until(cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_register_renew_republish_and_leave(etcd: Etcd) -> None:
    node = FakeNode("n1")
    reg = Registration(etcd, "/m1/", node, ttl_s=2, publish_every_s=0.2)
    members = Members(etcd, "/m1/")
    await reg.start()
    await members.start()
    try:
        assert set(members.nodes) == {"n1"}
        assert members.nodes["n1"].capacity.max_sandboxes == 4
        kv = await etcd.get("/m1/nodes/n1")
        assert kv is not None and kv.lease == reg.lease
        await asyncio.sleep(3.0)  # past the TTL: renewed
        assert await etcd.get("/m1/nodes/n1") is not None
        node.rec.usage = Usage(sandboxes=3, memory_mib=1536)
        node.rec.templates = ["base"]
        await _until(lambda: members.nodes["n1"].usage.sandboxes == 3)
        assert members.nodes["n1"].templates == ["base"]
        writes = (await etcd.get("/m1/nodes/n1")).version  # type: ignore[union-attr]
        await asyncio.sleep(1.0)  # nothing changed: nothing written
        assert (await etcd.get("/m1/nodes/n1")).version == writes  # type: ignore[union-attr]
        other = Registration(etcd, "/m1/", FakeNode("n2"), ttl_s=2)
        await other.start()
        await _until(lambda: set(members.nodes) == {"n1", "n2"})  # no restart of the watcher
        await other.stop()
        await _until(lambda: set(members.nodes) == {"n1"})
    finally:
        await reg.stop()
        await members.stop()
    assert await etcd.get("/m1/nodes/n1") is None  # leaving revokes the lease


async def test_a_dead_node_is_lost_within_its_ttl_and_an_expired_lease_registers_again(
    etcd: Etcd,
) -> None:
    members = Members(etcd, "/m2/")
    await members.start()
    dead = Registration(etcd, "/m2/", FakeNode("dead"), ttl_s=2)
    await dead.start()
    await _until(lambda: "dead" in members.nodes)
    assert dead._task is not None
    dead._task.cancel()  # the node dies: nobody renews, nobody revokes
    t0 = asyncio.get_running_loop().time()
    await _until(lambda: "dead" not in members.nodes, timeout=10)
    # TTL + etcd's expiry checks (every 500 ms) + slack for a loaded host
    assert asyncio.get_running_loop().time() - t0 <= 2 + 3
    live = Registration(etcd, "/m2/", FakeNode("back"), ttl_s=2, publish_every_s=0.2)
    await live.start()
    try:
        first = live.lease
        await etcd.revoke(first)  # as if etcd had been out of reach past the TTL
        await _until(lambda: live.lease != first, timeout=10)
        await _until(lambda: "back" in members.nodes)
        kv = await etcd.get("/m2/nodes/back")
        assert kv is not None and kv.lease == live.lease
    finally:
        await live.stop()
        await members.stop()


async def test_a_held_event_loop_keeps_its_lease_unless_it_stays_held(etcd: Etcd,
                                                                      one: EtcdCluster) -> None:
    """Renewed from a thread (cluster/lease.py): a node's loop held for less than half the
    TTL (a fork burst's) keeps the lease renewed meanwhile; one held past the TTL does not,
    and the node registers again once its loop turns."""
    reg = Registration(etcd, "/m3/", FakeNode("busy"), ttl_s=2, publish_every_s=0.2,
                       renew_with=lambda: Etcd(one.endpoints))  # fmt: skip
    await reg.start()
    try:
        first = reg.lease
        await asyncio.sleep(0.5)
        before = reg.renewed_at
        time.sleep(0.9)  # the loop held (alive_s is 1 s): renewals go on
        assert reg.renewed_at > before + 0.3
        time.sleep(3.0)  # held past the TTL: not renewed, the lease lapses
        await _until(lambda: reg.lease != first, timeout=10)
        kv = await etcd.get("/m3/nodes/busy")
        assert kv is not None and kv.lease == reg.lease
    finally:
        await reg.stop()
    assert await etcd.get("/m3/nodes/busy") is None
