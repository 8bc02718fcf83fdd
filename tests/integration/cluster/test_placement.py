"""Placement (`cluster/placement.py`) against a real etcd: a storm of placements from several
clients (as from several gateways) never takes a node over its sandbox or memory limit,
prefers nodes holding the template, spreads otherwise, skips draining nodes, and release
gives the reservation back."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from aenv.cluster.etcd import Etcd, EtcdError
from aenv.cluster.membership import Capacity, NodeRecord
from aenv.cluster.placement import (
    AlreadyBound,
    PlacementFailed,
    PlacementRequest,
    PreferLocal,
    TeamLimitReached,
    TeamQuota,
    binding,
    place,
    release,
    team_usage_prefix,
)
from tests.support.etcd import EtcdCluster


@pytest.fixture
async def clients(one: EtcdCluster) -> AsyncIterator[list[Etcd]]:
    cs = [Etcd(one.endpoints) for _ in range(3)]  # three "gateways"
    yield cs
    for c in cs:
        await c.aclose()


def _node(name: str, max_sandboxes: int, memory_mib: int, templates: list[str] | None = None,
          draining: bool = False) -> NodeRecord:
    return NodeRecord(name=name, url=f"http://{name}", version="t", draining=draining,
                      capacity=Capacity(max_sandboxes=max_sandboxes, memory_mib=memory_mib),
                      templates=templates or [])  # fmt: skip


def _prefix() -> str:
    return f"/p{os.urandom(3).hex()}/"


async def test_a_storm_from_three_placers_never_exceeds_any_node(clients: list[Etcd]) -> None:
    prefix = _prefix()
    nodes = [_node("a", 5, 10_000), _node("b", 7, 10_000), _node("c", 20, 2_048)]
    # 40 asks of 512 MiB for 5 + 7 + 4 (c's memory) = 16 places.
    reqs = [PlacementRequest(f"sbx{i:02d}", 512) for i in range(40)]

    async def one(i: int, req: PlacementRequest) -> str | None:
        try:
            return (await place(clients[i % 3], prefix, nodes, req)).name
        except PlacementFailed:
            return None

    got = await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))
    counts = Counter(n for n in got if n)
    assert counts == {"a": 5, "b": 7, "c": 4}, counts
    for i, req in enumerate(reqs):  # every success is bound where it was placed
        b = await binding(clients[0], prefix, req.sandbox_id)
        assert (b.node if b else None) == got[i]


async def test_prefers_nodes_with_the_template_then_the_least_loaded(clients: list[Etcd]) -> None:
    prefix, etcd = _prefix(), clients[0]
    nodes = [_node("a", 10, 8192), _node("b", 10, 8192, templates=["tpl-x"]),
             _node("c", 10, 8192, draining=True)]
    for i in range(3):  # "b" holds it: every one goes there while it fits
        assert (await place(etcd, prefix, nodes, PlacementRequest(f"x{i}", 512, "tpl-x"))).name \
            == "b"
    spread = [(await place(etcd, prefix, nodes, PlacementRequest(f"y{i}", 512))).name
              for i in range(5)]
    # a holds none, b three: a until both hold three (a tie goes by name), then b; never
    # the draining c.
    assert spread == ["a", "a", "a", "a", "b"]
    assert PreferLocal().choose(PlacementRequest("z", 512), []) is None


async def test_release_gives_the_room_back_and_ids_are_never_bound_twice(
    clients: list[Etcd],
) -> None:
    prefix, etcd = _prefix(), clients[0]
    nodes = [_node("solo", 1, 1024)]
    await place(etcd, prefix, nodes, PlacementRequest("first", 1024))
    with pytest.raises(PlacementFailed, match="no node has room"):
        await place(etcd, prefix, nodes, PlacementRequest("second", 512))
    with pytest.raises(EtcdError, match="already bound"):  # full aside, the id is taken
        await place(etcd, prefix, [_node("other", 5, 9999)], PlacementRequest("first", 1))
    assert await release(etcd, prefix, "first") is True
    assert await release(etcd, prefix, "first") is False
    assert (await place(etcd, prefix, nodes, PlacementRequest("second", 512))).name == "solo"


async def test_a_paused_sandbox_moves_once_however_many_gateways_move_it(
    clients: list[Etcd],
) -> None:
    """The move of a paused sandbox to another node (its own lost) replaces its binding as
    read: of several gateways moving it at once, one wins and the others see where to."""
    prefix = _prefix()
    await place(clients[0], prefix, [_node("old", 5, 10_000)], PlacementRequest("sbx", 512))
    kv = await clients[0].get(f"{prefix}bindings/sbx")
    assert kv is not None
    nodes = [_node("a", 5, 10_000), _node("b", 5, 10_000)]

    async def move(i: int) -> str:
        try:
            return (await place(clients[i], prefix, nodes, PlacementRequest("sbx", 512),
                                replacing=kv.mod_revision)).name  # fmt: skip
        except AlreadyBound:
            return "lost"

    got = await asyncio.gather(*(move(i) for i in range(3)))
    b = await binding(clients[0], prefix, "sbx")
    assert b is not None and b.node in ("a", "b")
    assert sorted(got).count("lost") == 2 and b.node in got
    with pytest.raises(AlreadyBound):  # the binding as read is gone
        await place(clients[0], prefix, nodes, PlacementRequest("sbx", 512),
                    replacing=kv.mod_revision)  # fmt: skip


async def _team_usage(etcd: Etcd, prefix: str, team: str) -> dict[str, tuple[int, int]]:
    kvs, _ = await etcd.get_prefix(team_usage_prefix(prefix, team))
    return {kv.key.rsplit("/", 1)[1]: (json.loads(kv.value)["sandboxes"],
                                       json.loads(kv.value)["memory_mib"]) for kv in kvs}


async def test_a_teams_limits_hold_across_nodes_and_placers(clients: list[Etcd]) -> None:
    """Three placers, two nodes with room for 20: a team of max 5 sandboxes gets 5 across
    both nodes, the rest TeamLimitReached; another team is not held back; a release gives
    one back; a memory limit counts what is asked."""
    prefix = _prefix()
    nodes = [_node("a", 10, 100_000), _node("b", 10, 100_000)]
    red = TeamQuota("t-red", "red", max_sandboxes=5)
    reqs = [PlacementRequest(f"red{i:02d}", 256, quota=red) for i in range(16)]

    async def one(i: int, req: PlacementRequest) -> str | None:
        try:
            return (await place(clients[i % 3], prefix, nodes, req)).name
        except TeamLimitReached as e:
            assert "team red may run 5 sandboxes at once and runs 5" in str(e)
            return None

    got = await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))
    placed = [r.sandbox_id for r, n in zip(reqs, got, strict=True) if n]
    assert len(placed) == 5 and set(got) - {None} == {"a", "b"}, got
    usage = await _team_usage(clients[0], prefix, "t-red")
    assert sum(s for s, _ in usage.values()) == 5
    assert (await binding(clients[0], prefix, placed[0])).team == "t-red"
    # Other teams (and the default one) place as before.
    await place(clients[1], prefix, nodes, PlacementRequest("blue1", 256, quota=TeamQuota(
        "t-blue", "blue", max_sandboxes=1)))  # fmt: skip
    await place(clients[2], prefix, nodes, PlacementRequest("plain", 256))
    with pytest.raises(TeamLimitReached):
        await place(clients[0], prefix, nodes, PlacementRequest("red99", 256, quota=red))
    assert await release(clients[0], prefix, placed[0])
    assert sum(s for s, _ in (await _team_usage(clients[0], prefix, "t-red")).values()) == 4
    await place(clients[0], prefix, nodes, PlacementRequest("red99", 256, quota=red))
    # Memory: 1536 MiB at most, 5 x 256 held: 512 more would pass it, 256 fits.
    big = TeamQuota("t-red", "red", max_memory_mib=1536)
    with pytest.raises(TeamLimitReached, match="may use 1536 MiB at once and uses 1280 MiB"):
        await place(clients[1], prefix, nodes, PlacementRequest("redbig", 512, quota=big))
    await place(clients[1], prefix, nodes, PlacementRequest("redfit", 256, quota=big))
