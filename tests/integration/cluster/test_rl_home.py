"""The cluster's RL home (cluster/gateway/rl_home.py) on a real etcd: gateways choosing at
once agree on one node, and a lost home is replaced."""

from __future__ import annotations

import asyncio

from aenv.cluster.etcd import Etcd
from aenv.cluster.gateway.rl_home import RlHome
from aenv.cluster.membership import NodeRecord


def _nodes(*names: str) -> list[NodeRecord]:
    return [NodeRecord.model_construct(name=n, url=f"http://{n}") for n in names]


async def test_gateways_agree_on_one_home_and_replace_a_lost_one(etcd: Etcd) -> None:
    live = _nodes("n2", "n1", "n3")
    # Each gateway sees the members in its own order, at once: one transaction wins.
    gws = [RlHome(etcd, "/t-rl/", lambda i=i: live[i:] + live[:i]) for i in range(3)]
    homes = await asyncio.gather(*(g.node() for _ in range(4) for g in gws))
    assert {h.name for h in homes if h is not None} == {"n1"} and None not in homes
    assert (await etcd.get("/t-rl/rl/home")).value == b"n1"  # type: ignore[union-attr]
    # A node joining later does not move it ...
    live.insert(0, NodeRecord.model_construct(name="n0", url="http://n0"))
    assert (await gws[1].node()).name == "n1"  # type: ignore[union-attr]
    # ... its loss does: every gateway moves to the same new home.
    live[:] = [n for n in live if n.name != "n1"]
    homes = await asyncio.gather(*(g.node() for g in gws))
    assert {h.name for h in homes if h is not None} == {"n0"}
    live.clear()
    assert await gws[0].node() is None
