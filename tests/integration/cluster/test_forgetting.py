"""Nodes that never come back (`cluster/forgetting.py`) against a real etcd: a node absent
past the bound loses its bindings, reservation and share of team usage, but not the
bindings of its published paused sandboxes; the first mark's time stands whoever looks; a
node that registers again keeps everything; a binding moved meanwhile is left alone."""

from __future__ import annotations

import os

from aenv.cluster.etcd import Etcd
from aenv.cluster.forgetting import Forgetting, lost_prefix
from aenv.cluster.membership import Capacity, NodeRecord, nodes_prefix
from aenv.cluster.placement import (
    Binding,
    Reservation,
    binding_key,
    hold_key,
    reservation_key,
    team_usage_key,
    team_usage_prefix,
)
from aenv.cluster.published import paused_key


def _record(name: str) -> str:
    return NodeRecord(name=name, url="http://n", version="t",
                      capacity=Capacity(max_sandboxes=9, memory_mib=1 << 20)).model_dump_json()


async def _bind(etcd: Etcd, prefix: str, sid: str, node: str) -> None:
    await etcd.put(binding_key(prefix, sid), Binding(node=node, memory_mib=256).model_dump_json())


async def _keys(etcd: Etcd, prefix: str) -> set[str]:
    kvs, _ = await etcd.get_prefix(prefix)
    return {kv.key[len(prefix):] for kv in kvs}


async def test_an_absent_node_is_forgotten_after_the_bound_but_its_published_pauses(
    etcd: Etcd,
) -> None:
    p = f"/f{os.urandom(3).hex()}/"
    await etcd.put(nodes_prefix(p) + "live", _record("live"))
    await _bind(etcd, p, "a", "live")
    for sid in ("g1", "g2", "g3"):
        await _bind(etcd, p, sid, "ghost")
    await etcd.put(paused_key(p, "g3"), "{}")  # g3's paused state is published
    for node in ("live", "ghost"):
        await etcd.put(reservation_key(p, node), Reservation(sandboxes=2).model_dump_json())
        await etcd.put(team_usage_key(p, "red", node), Reservation(sandboxes=1).model_dump_json())
    await etcd.put(hold_key(p, "red", "x"), Reservation(sandboxes=1).model_dump_json())
    now = [1000.0]
    forgetting = Forgetting(etcd, p, after_s=100, clock=lambda: now[0])

    r = await forgetting.round()
    assert r.marked == ["ghost"] and r.bindings == [] and r.reservations == []
    now[0] += 60
    # Another node looking later does not restart the clock.
    assert (await Forgetting(etcd, p, after_s=100, clock=lambda: now[0]).round()).marked == []
    assert (await forgetting.round()).bindings == []
    now[0] += 50
    r = await forgetting.round()
    assert r.bindings == ["g1", "g2"] and r.reservations == ["ghost"]
    assert await _keys(etcd, binding_key(p, "")) == {"a", "g3"}
    assert await _keys(etcd, reservation_key(p, "")) == {"live"}
    # its share of the team's usage goes; a hold is no node's (it ends with its lease)
    assert await _keys(etcd, team_usage_prefix(p)) == {"red/live", "red/@hold-x"}
    # g3 still names ghost: the mark stays, and the next round deletes nothing more.
    assert await _keys(etcd, lost_prefix(p)) == {"ghost"}
    r = await forgetting.round()
    assert (r.marked, r.bindings, r.reservations) == ([], [], [])

    # g3 resumes elsewhere (its binding moves): nothing names ghost, its mark goes.
    await etcd.delete(paused_key(p, "g3"))
    await _bind(etcd, p, "g3", "live")
    assert (await forgetting.round()).returned == ["ghost"]
    assert await _keys(etcd, lost_prefix(p)) == set()
    assert await _keys(etcd, binding_key(p, "")) == {"a", "g3"}


async def test_a_node_that_registers_again_keeps_its_bindings(etcd: Etcd) -> None:
    p = f"/f{os.urandom(3).hex()}/"
    await _bind(etcd, p, "b1", "back")
    now = [1000.0]
    forgetting = Forgetting(etcd, p, after_s=100, clock=lambda: now[0])
    assert (await forgetting.round()).marked == ["back"]
    await etcd.put(nodes_prefix(p) + "back", _record("back"))
    now[0] += 1000
    r = await forgetting.round()
    assert r.returned == ["back"] and r.bindings == []
    assert await _keys(etcd, binding_key(p, "")) == {"b1"}
    assert await _keys(etcd, lost_prefix(p)) == set()


async def test_a_binding_moved_after_the_read_is_left_alone(etcd: Etcd) -> None:
    p = f"/f{os.urandom(3).hex()}/"
    for sid in ("m1", "m2"):
        await _bind(etcd, p, sid, "gone")
    now = [1000.0]

    class Moving(Forgetting):
        async def _all(self, prefix: str):  # type: ignore[no-untyped-def]
            kvs = await super()._all(prefix)
            if prefix == binding_key(p, "") and now[0] > 1000:
                await _bind(etcd, p, "m2", "other")  # a gateway moves m2 after this read
            return kvs

    forgetting = Moving(etcd, p, after_s=100, clock=lambda: now[0])
    assert (await forgetting.round()).marked == ["gone"]
    now[0] += 200
    r = await forgetting.round()
    # One guarded transaction per batch: m2's binding changed, so the batch is left alone.
    assert r.bindings == []
    assert await _keys(etcd, binding_key(p, "")) == {"m1", "m2"}
    r = await forgetting.round()  # read anew: m1 goes, m2 (now other's) stays
    assert r.bindings == ["m1"]
