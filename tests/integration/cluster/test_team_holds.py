"""Team holds (`cluster/team_holds.py`) against a real etcd: places a fork or a woken sandbox
takes for a limited team count against every placement, and placements against them; past
the limit a hold is refused whole; a hold goes LINGER_S after its block, or with its lease
when its holder dies."""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest

from aenv.cluster import team_holds
from aenv.cluster.etcd import Etcd
from aenv.cluster.membership import Capacity, NodeRecord
from aenv.cluster.placement import (
    PlacementRequest,
    TeamQuota,
    place,
    team_usage_prefix,
)
from aenv.cluster.placement import TeamLimitReached as PlacementRefused
from aenv.cluster.team_holds import TeamHolds
from aenv.cluster.teams import EtcdTeams
from aenv.orchestrator.errors import TeamLimitReached


def _node(name: str) -> NodeRecord:
    return NodeRecord(name=name, url=f"http://{name}", version="t",
                      capacity=Capacity(max_sandboxes=50, memory_mib=100_000))  # fmt: skip


async def _held(etcd: Etcd, prefix: str, team: str) -> list[str]:
    kvs, _ = await etcd.get_prefix(team_usage_prefix(prefix, team))
    return [kv.key.rsplit("/", 1)[1] for kv in kvs]


async def test_holds_and_placements_count_against_each_other(
    etcd: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(team_holds, "LINGER_S", 0.2)
    prefix = f"/h{os.urandom(3).hex()}/"
    teams = EtcdTeams(etcd, prefix)
    await teams.start()
    try:
        red = await teams.create_team("red", max_sandboxes=4, max_memory_mib=4096)
        holds = TeamHolds(etcd, prefix, teams)
        quota = TeamQuota(red.team_id, "red", 4, 4096)
        nodes = [_node("a"), _node("b")]
        await place(etcd, prefix, nodes, PlacementRequest("s1", 512, quota=quota))
        async with holds.hold(red.team_id, 3, 3 * 512, "fork 3"):
            held = await _held(etcd, prefix, red.team_id)
            assert len(held) == 2 and any(h.startswith("@hold-") for h in held)
            # 1 placed + 3 held: the next placement, and another hold, are refused.
            with pytest.raises(PlacementRefused, match="runs 4 across the cluster"):
                await place(etcd, prefix, nodes, PlacementRequest("s2", 512, quota=quota))
            with pytest.raises(TeamLimitReached, match="cannot fork 1: team red may run 4"):
                async with holds.hold(red.team_id, 1, 512, "fork 1"):
                    pass
        # LINGER_S after its block the hold goes: room again.
        await asyncio.sleep(0.6)
        assert await _held(etcd, prefix, red.team_id) == ["a"]
        # A hold of more than the limit allows is refused whole (memory too).
        with pytest.raises(TeamLimitReached, match=r"\(4 more asked\)"):
            async with holds.hold(red.team_id, 4, 4 * 512, "fork 4"):
                pass
        with pytest.raises(TeamLimitReached, match="may use 4096 MiB"):
            async with holds.hold(red.team_id, 1, 4000, "fork 1"):
                pass
        assert await _held(etcd, prefix, red.team_id) == ["a"]  # refusals leave nothing
        # A team without limits holds nothing.
        async with holds.hold("default", 20, 20 * 512, "fork 20"):
            assert await _held(etcd, prefix, "default") == []
    finally:
        await teams.stop()


async def test_a_dead_holders_hold_goes_with_its_lease(
    etcd: Etcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that dies mid-fork does not keep its team's places: the lease runs out."""
    monkeypatch.setattr(team_holds, "HOLD_TTL_S", 2)
    monkeypatch.setattr(team_holds, "KEEPALIVE_S", 0.5)
    prefix = f"/h{os.urandom(3).hex()}/"
    teams = EtcdTeams(etcd, prefix)
    await teams.start()
    try:
        red = await teams.create_team("red", max_sandboxes=1)
        holds = TeamHolds(etcd, prefix, teams)
        entered = asyncio.Event()

        async def fork_that_dies() -> None:
            async with holds.hold(red.team_id, 1, 512, "fork 1"):
                entered.set()
                await asyncio.sleep(60)  # kept alive past its TTL while it runs

        task = asyncio.create_task(fork_that_dies())
        await entered.wait()
        await asyncio.sleep(2.5)
        assert len(await _held(etcd, prefix, red.team_id)) == 1  # the keepalive kept it
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        lingering = list(holds._lingering)
        assert lingering
        for t in lingering:  # the process ends before it lets the hold go
            t.cancel()
        await asyncio.gather(*lingering, return_exceptions=True)
        for _ in range(50):
            if not await _held(etcd, prefix, red.team_id):
                break
            await asyncio.sleep(0.2)
        assert await _held(etcd, prefix, red.team_id) == []
    finally:
        await teams.stop()
