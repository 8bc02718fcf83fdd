"""Holds: a limited team's places taken in etcd for sandboxes no placement made, so that its
limits hold across the cluster for them too (docs/cluster.md, "Teams").

A gateway places creates and resumes (`placement.py`). A fork's children are made by the
source's node (and the nodes it asks), and a paused sandbox woken by traffic to one of its
ports is resumed by its node: for those, the node takes a hold first (`placement.hold`: a
key of the team's usage range that every placement counts, written after the same check
and under the same range guard). The hold lives on a lease kept alive while the operation
runs, so a node that dies holding one frees it within HOLD_TTL_S. After the operation it
stays LINGER_S more, until the nodes' bindings rounds count the sandboxes it made; the two
overlap a moment, erring towards refusing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator

from aenv.cluster import placement
from aenv.cluster.etcd import Etcd, EtcdError
from aenv.cluster.placement import TeamQuota
from aenv.cluster.teams import EtcdTeams
from aenv.orchestrator.errors import TeamLimitReached, Unavailable
from aenv.teams.model import TeamNotFound

log = logging.getLogger("aenv.cluster")

HOLD_TTL_S = 30
KEEPALIVE_S = 10.0
LINGER_S = 3.0  # a bindings round runs every second, and at once after a record changes


class TeamHolds:
    def __init__(self, etcd: Etcd, prefix: str, teams: EtcdTeams) -> None:
        self.etcd, self.prefix, self.teams = etcd, prefix, teams
        self._lingering: dict[asyncio.Task[None], int] = {}  # letting go -> its lease

    def quota(self, team_id: str) -> TeamQuota | None:
        try:
            t = self.teams.team(team_id)
        except TeamNotFound:  # deleted: its sandboxes hold no limit
            return None
        q = TeamQuota(t.team_id, t.name, t.max_sandboxes, t.max_memory_mib)
        return q if q.limited else None

    @contextlib.asynccontextmanager
    async def hold(self, team_id: str, vms: int, memory_mib: int, op: str
                   ) -> AsyncIterator[None]:  # fmt: skip
        """Hold `vms` places of `memory_mib` MiB in all for the team while the block runs
        (and LINGER_S after). TeamLimitReached (429, not to retry) past its limits;
        Unavailable (503) if etcd cannot be asked. A team without limits holds nothing."""
        q = self.quota(team_id)
        if q is None or vms < 1:
            yield
            return
        try:
            lease = await self.etcd.grant(HOLD_TTL_S)
        except EtcdError as e:
            raise Unavailable(f"cannot {op}: the cluster's etcd is out of reach ({e})") from e
        try:
            await placement.hold(self.etcd, self.prefix, q, vms, memory_mib,
                                 secrets.token_hex(6), lease)  # fmt: skip
        except placement.TeamLimitReached as e:
            await self._revoke(lease)
            raise TeamLimitReached(f"cannot {op}: {e}; kill or pause some, or ask for a "
                                   "higher limit") from None  # fmt: skip
        except (EtcdError, placement.PlacementFailed) as e:
            await self._revoke(lease)
            raise Unavailable(f"cannot {op}: {e}") from e
        keep = asyncio.get_running_loop().create_task(self._keep(lease))
        try:
            yield
        finally:
            keep.cancel()
            t = asyncio.get_running_loop().create_task(self._let_go(lease))
            self._lingering[t] = lease
            t.add_done_callback(lambda t: self._lingering.pop(t, None))

    async def _keep(self, lease: int) -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_S)
            with contextlib.suppress(EtcdError):
                await self.etcd.keepalive(lease)

    async def _let_go(self, lease: int) -> None:
        await asyncio.sleep(LINGER_S)
        await self._revoke(lease)

    async def _revoke(self, lease: int) -> None:
        try:
            await self.etcd.revoke(lease)
        except EtcdError as e:  # it ends at its TTL anyway
            log.info("revoking a team hold's lease: %s", e)

    async def close(self) -> None:
        """Let every lingering hold go now (the node stops)."""
        lingering = dict(self._lingering)
        for t in lingering:
            t.cancel()
        await asyncio.gather(*lingering, return_exceptions=True)
        for lease in lingering.values():
            await self._revoke(lease)
