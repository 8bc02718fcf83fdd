"""`fork(count=N)` over several nodes (docs/cluster.md, "Across nodes"): the children the
source's node has no room for start on other nodes, from the fork's own snapshot.

- The source's node makes every child's record (the source's env, metadata, lifecycle, a
  token of its own) and takes the fork's snapshot. While that snapshot exists, it asks the
  other nodes with room, most room first (as their records say), to start the rest
  (`POST /cluster/v1/fork-children`, under the cluster token).
- Such a node fetches the snapshot from the source's node (range requests: the template's
  chunks come from its own disk), starts as many children as it has room for, answers one
  entry per child as a fork answers, and drops its copy of the snapshot.
- The client gets one list: children started here, then those started elsewhere, then
  429 entries for those no node had room for. Each child is bound to its node by that
  node's bindings round, as a fork's children are.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import httpx

from aenv.cluster import wire
from aenv.cluster.identity import node_url
from aenv.cluster.peers import describe
from aenv.cluster.takeover import record_json
from aenv.machines.api import TemplateNotFound
from aenv.orchestrator.errors import CapacityExhausted, NotFound, Unavailable
from aenv.orchestrator.requests import FULL_RETRY_AFTER_S
from aenv.orchestrator.store import SandboxRecord

if TYPE_CHECKING:
    from aenv.cluster.sharing import Sharing

FORK_TIMEOUT = httpx.Timeout(600.0, connect=5.0)


class Forks:
    def __init__(self, sharing: Sharing) -> None:
        self.s = sharing

    async def elsewhere(self, snapshot_id: str, kids: list[SandboxRecord]) -> list[object]:
        s = self.s
        try:
            peers = [p for p in await s._peers() if not p.draining]
        except Exception as e:  # etcd out of reach: the children stay unplaced
            return [Unavailable(f"no other node could be asked: {e}") for _ in kids]
        mem = max(kids[0].memory_mib, 1) if kids else 1
        room = {p.name: max(0, min(p.capacity.max_sandboxes - p.usage.sandboxes,
                                   (p.capacity.memory_mib - p.usage.memory_mib) // mem))
                for p in peers}  # fmt: skip
        plan: list[tuple[Any, list[SandboxRecord]]] = []
        left = list(kids)
        for p in sorted(peers, key=lambda p: (-room[p.name], p.name)):
            take, left = left[:room[p.name]], left[room[p.name]:]
            if take:
                plan.append((p, take))
        answers = await asyncio.gather(*(self._ask(p.url, snapshot_id, take)
                                         for p, take in plan))  # fmt: skip
        out: list[object] = [a for got in answers for a in got]
        return out + [CapacityExhausted("no node of the cluster has room for this child",
                                        retry_after_s=FULL_RETRY_AFTER_S) for _ in left]

    async def _ask(self, url: str, snapshot_id: str, kids: list[SandboxRecord]) -> list[object]:
        s = self.s
        body = {"snapshot": snapshot_id, "source": {"node": s.node, "url": node_url(s.cfg)},
                "children": [record_json(k, s.sealer()) for k in kids]}  # fmt: skip
        try:
            r = await s.client.post(url + f"{wire.INTERNAL_PREFIX}/fork-children", json=body,
                                    headers={wire.TOKEN_HEADER: s.cfg.cluster.token},
                                    timeout=FORK_TIMEOUT)  # fmt: skip
            got = r.json()
            if r.status_code != 201 or not isinstance(got, list) or len(got) != len(kids):
                raise ValueError(f"answered {r.status_code}: {str(got)[:200]}")
        except (httpx.HTTPError, ValueError) as e:
            return [Unavailable(f"the node at {url} did not start it: {e}") for _ in kids]
        return [a if isinstance(a, dict) else Unavailable(str(a)) for a in got]

    async def here(self, snapshot_id: str, source: str, url: str, records: list[SandboxRecord]
                   ) -> list[SandboxRecord | BaseException]:  # fmt: skip
        s = self.s
        pub = await describe(s.client, url, snapshot_id, s.cfg.cluster.token)
        if pub is None:
            raise NotFound(f"fork snapshot {snapshot_id} is not on node {source}")
        fetched = not s._have(snapshot_id)
        if fetched:
            await s._fetch(pub, [(source, url)], from_store=False)
        try:
            return await s.orch.fork_children_here(snapshot_id, records)
        finally:
            if fetched:  # a fork's snapshot is transient: its children hold their own files
                with contextlib.suppress(TemplateNotFound):
                    await asyncio.to_thread(s.runtime.delete_snapshot, snapshot_id)
