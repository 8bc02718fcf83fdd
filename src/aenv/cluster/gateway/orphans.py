"""Creates through a gateway that nobody received: the gateway's half of the node's rule
(orchestrator/orphans.py). The node's client is the gateway, which waits for the answer, so
only the gateway sees its own client leave; it then kills the sandbox on its node, or, for a
create with an `Idempotency-Key`, does so after the grace unless a retry (through any
gateway) took it: the key's claim in etcd says so (`Idempotency.received`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aenv.cluster.etcd import EtcdError
from aenv.cluster.gateway.idempotency import Idempotency
from aenv.cluster.gateway.nodes import NodeUnreachable, call
from aenv.cluster.membership import NodeRecord
from aenv.obs import log_event
from aenv.orchestrator.orphans import KEYED_GRACE_S
from aenv.tasks import TaskSet

log = logging.getLogger("aenv.gateway")
Headers = list[tuple[bytes, bytes]]


class GatewayOrphans:
    def __init__(self, links: Any, keyed_grace_s: float = KEYED_GRACE_S) -> None:
        self.links = links
        self.keyed_grace_s = keyed_grace_s
        self._tasks = TaskSet()

    def left(self, node: NodeRecord, sandbox_id: str, headers: Headers,
             claim: tuple[Idempotency, str] | None) -> None:  # fmt: skip
        """The create of `sandbox_id` on `node` answered after its client had gone."""
        self._tasks.spawn(self._remove(node, sandbox_id, headers, claim),
                          f"aenv-orphan-{sandbox_id}")

    async def _remove(self, node: NodeRecord, sandbox_id: str, headers: Headers,
                      claim: tuple[Idempotency, str] | None) -> None:  # fmt: skip
        if claim is not None:
            await asyncio.sleep(self.keyed_grace_s)
            idem, key = claim
            try:
                c = await idem.get(key)
            except EtcdError as e:
                log.warning("orphan %s: reading its key: %s", sandbox_id, e)
                return  # kept: the sandbox's timeout ends it
            if c is None or c.received:
                return
        try:
            a = await call(self.links, node, "DELETE", f"/sandboxes/{sandbox_id}".encode(),
                           headers)  # fmt: skip
        except NodeUnreachable as e:
            log.warning("orphan %s on %s: %s", sandbox_id, node.name, e)
            return
        log_event(log, "sandbox.orphan_removed", sandbox_id=sandbox_id, node=node.name,
                  keyed=claim is not None, status=a.status)  # fmt: skip

    async def close(self) -> None:
        await self._tasks.close()
