"""A node's bindings (`cluster/bindings.py`) against a real etcd: its records bound to it
with what they hold, gateway placements on their way kept (then dropped after the grace),
sandboxes gone unbound, another node's binding left alone, and the reservation always the
sum of what is held, also while gateways place on the node at the same time."""

from __future__ import annotations

import asyncio
import os

import pytest

from aenv.cluster.bindings import Held, NodeBindings
from aenv.cluster.etcd import Etcd, put_op
from aenv.cluster.membership import Capacity, NodeRecord
from aenv.cluster.placement import (
    Binding,
    PlacementFailed,
    PlacementRequest,
    Reservation,
    binding,
    binding_key,
    place,
    reservation_key,
    team_usage_prefix,
)


def _node(name: str = "n1", max_sandboxes: int = 50) -> NodeRecord:
    return NodeRecord(name=name, url="http://n", version="t",
                      capacity=Capacity(max_sandboxes=max_sandboxes, memory_mib=1 << 20))


async def _reservation(etcd: Etcd, prefix: str, node: str = "n1") -> Reservation:
    kv = await etcd.get(reservation_key(prefix, node))
    return Reservation.model_validate_json(kv.value) if kv else Reservation()


async def test_records_are_bound_and_the_reservation_is_what_they_hold(etcd: Etcd) -> None:
    prefix = f"/b{os.urandom(3).hex()}/"
    records = {"a": Held(512, "base", holds=True), "b": Held(1024, "base", holds=False)}
    nb = NodeBindings(etcd, prefix, "n1", lambda: dict(records), pending_grace_s=0.5)
    assert await nb.reconcile()
    assert await binding(etcd, prefix, "a") == Binding(node="n1", memory_mib=512,
                                                       template="base", holds=True)
    assert (await binding(etcd, prefix, "b")).holds is False  # type: ignore[union-attr]
    assert await _reservation(etcd, prefix) == Reservation(sandboxes=1, memory_mib=512)
    # A gateway places "c" here: kept, holding, while its create is on its way.
    await place(etcd, prefix, [_node()], PlacementRequest("c", 256))
    assert await nb.reconcile()
    assert (await binding(etcd, prefix, "c")).pending is True  # type: ignore[union-attr]
    assert await _reservation(etcd, prefix) == Reservation(sandboxes=2, memory_mib=768)
    records["c"] = Held(256, "", holds=True)  # ... created: the node's own binding now
    del records["a"]  # ... and "a" is gone
    assert await nb.reconcile()
    assert (await binding(etcd, prefix, "c")).pending is False  # type: ignore[union-attr]
    assert await binding(etcd, prefix, "a") is None
    assert await _reservation(etcd, prefix) == Reservation(sandboxes=1, memory_mib=256)
    # A placement whose create never came is dropped after the grace.
    await place(etcd, prefix, [_node()], PlacementRequest("d", 128))
    await asyncio.sleep(0.6)
    assert await nb.reconcile()
    assert await binding(etcd, prefix, "d") is None
    # One of ours bound to another node: logged and left alone, never taken over.
    other = Binding(node="n2", memory_mib=64).model_dump_json()
    await etcd.txn([], [put_op(binding_key(prefix, "e"), other)])
    records["e"] = Held(64, "", holds=True)
    assert await nb.reconcile()
    assert (await binding(etcd, prefix, "e")).node == "n2"  # type: ignore[union-attr]
    assert await _reservation(etcd, prefix) == Reservation(sandboxes=1, memory_mib=256)


async def test_a_sandbox_created_and_ended_between_two_rounds_holds_nothing(etcd: Etcd) -> None:
    """A gateway's placement whose create arrived and whose sandbox ended before the node's
    next round: its pending binding is dropped at once, not held for the grace (a create and
    kill loop through a gateway filled the nodes' reservations that way)."""
    prefix = f"/b{os.urandom(3).hex()}/"
    ended: set[str] = set()
    nb = NodeBindings(etcd, prefix, "n1", dict, pending_grace_s=60, ended=ended.__contains__)
    for sid in ("a", "b"):
        await place(etcd, prefix, [_node()], PlacementRequest(sid, 512))
    ended.add("a")  # "a" came and went; "b" is still on its way
    assert await nb.reconcile()
    assert await binding(etcd, prefix, "a") is None
    assert (await binding(etcd, prefix, "b")).pending is True  # type: ignore[union-attr]
    assert await _reservation(etcd, prefix) == Reservation(sandboxes=1, memory_mib=512)


async def test_placements_racing_the_node_are_never_lost(etcd: Etcd) -> None:
    prefix = f"/b{os.urandom(3).hex()}/"
    records = {f"own{i}": Held(100, "", holds=True) for i in range(5)}
    nb = NodeBindings(etcd, prefix, "n1", lambda: dict(records), interval_s=0.01)
    await nb.start()
    try:
        async def gateway(i: int) -> str | None:
            try:
                await place(etcd, prefix, [_node(max_sandboxes=20)],
                            PlacementRequest(f"gw{i}", 10))
                return f"gw{i}"
            except PlacementFailed:
                return None

        placed = [p for p in await asyncio.gather(*(gateway(i) for i in range(30))) if p]
        assert len(placed) == 15  # 20 minus the node's own 5, never more
        await asyncio.sleep(0.3)
        assert await nb.reconcile()
        r = await _reservation(etcd, prefix)
        assert r == Reservation(sandboxes=20, memory_mib=5 * 100 + 15 * 10)
        for p in placed:
            assert (await binding(etcd, prefix, p)).pending is True  # type: ignore[union-attr]
    finally:
        await nb.stop()


async def test_a_settled_node_reads_one_key_a_round_until_something_changes(
    etcd: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"/b{os.urandom(3).hex()}/"
    records = {"a": Held(512, "", holds=True)}
    nb = NodeBindings(etcd, prefix, "n1", lambda: dict(records))
    reads: list[str] = []
    real = Etcd.get_prefix

    async def counted(self: Etcd, p: str) -> object:
        if p.endswith("/bindings/"):  # the node's reads of every binding (not place()'s)
            reads.append(p)
        return await real(self, p)

    monkeypatch.setattr(Etcd, "get_prefix", counted)
    assert await nb.reconcile() and len(reads) == 1
    assert await nb.reconcile() and len(reads) == 1  # settled: the reservation alone
    await place(etcd, prefix, [_node()], PlacementRequest("gw", 64))  # changes it
    assert await nb.reconcile() and len(reads) == 2
    assert await nb.reconcile() and len(reads) == 3  # a placement pending: not settled
    records["b"] = Held(64, "", holds=False)
    del records["a"]
    assert await nb.reconcile() and len(reads) == 4
    assert await binding(etcd, prefix, "a") is None


async def test_the_node_keeps_each_teams_usage_true(etcd: Etcd) -> None:
    """The node writes its share of every team's usage from its records (what a placement
    checks team limits against), and removes a team's key when it holds nothing for it."""
    prefix = f"/b{os.urandom(3).hex()}/"
    records = {"a": Held(512, "base", True, "t-red"), "b": Held(256, "base", True, "t-red"),
               "c": Held(1024, "base", False, "t-red"), "d": Held(128, "base", True)}
    nb = NodeBindings(etcd, prefix, "n1", lambda: dict(records))
    assert await nb.reconcile()

    async def usage() -> dict[str, str]:
        kvs, _ = await etcd.get_prefix(team_usage_prefix(prefix))
        return {kv.key.removeprefix(team_usage_prefix(prefix)): kv.value.decode()
                for kv in kvs}  # fmt: skip

    assert await usage() == {"t-red/n1": '{"sandboxes":2,"memory_mib":768}',
                             "default/n1": '{"sandboxes":1,"memory_mib":128}'}
    assert (await binding(etcd, prefix, "a")).team == "t-red"
    del records["a"], records["b"]
    assert await nb.reconcile()
    assert await usage() == {"default/n1": '{"sandboxes":1,"memory_mib":128}'}
