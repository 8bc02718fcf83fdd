"""Where a cluster's RL plane lives: one node, named in etcd (`<prefix>rl/home`).

A node keeps its groups, leases and checkpoints in memory, so every `/rl/...` call must
reach the node that made them, whichever gateway receives it: calls with one group key
through two gateways join one group. The first gateway to need a home writes it in one
transaction (the key absent, or still naming the node it found lost); every other gateway
reads that. A call naming a sandbox (`/rl/sandboxes/<id>/...`) goes to the sandbox's node
instead (routing.py)."""

from __future__ import annotations

from collections.abc import Callable

from aenv.cluster.etcd import Etcd, compare_mod, compare_version, put_op, range_op
from aenv.cluster.membership import NodeRecord


class RlHome:
    def __init__(self, etcd: Etcd, prefix: str,
                 nodes: Callable[[], list[NodeRecord]]) -> None:  # fmt: skip
        self.etcd = etcd
        self.key = f"{prefix}rl/home"
        self.nodes = nodes  # the live members, by name

    async def node(self) -> NodeRecord | None:
        """The home node (chosen now if there is none, or it was lost), or None (no nodes)."""
        live = {n.name: n for n in self.nodes()}
        for _ in range(3):  # another gateway may choose at the same moment: read its choice
            kv = await self.etcd.get(self.key)
            if kv is not None and (home := live.get(kv.value.decode())) is not None:
                return home
            if not live:
                return None
            chosen = min(live)
            cond = (compare_version(self.key, "EQUAL", 0) if kv is None
                    else compare_mod(self.key, "EQUAL", kv.mod_revision))  # fmt: skip
            r = await self.etcd.txn([cond], [put_op(self.key, chosen)], [range_op(self.key)])
            if r.succeeded:
                return live[chosen]
        return None
