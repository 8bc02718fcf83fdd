"""Leases: what a trainer holds (groups, sandboxes) lives while the trainer renews it.

A trainer that dies stops renewing; the lease lapses and the RL plane reclaims everything it
held (`service.RL.sweep`). Members' own timeouts are pushed past the lease's end on every
renewal, so a lease, not a timeout, ends them; and if the node forgets a lease (a restart),
those timeouts still end its sandboxes shortly after."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from aenv.orchestrator.errors import InvalidRequest, NotFound

MIN_LEASE_S = 2.0
MAX_LEASE_S = 24 * 3600.0
DEFAULT_LEASE_S = 300.0  # a group's own lease, when its call names none
# A held sandbox's timeout reaches this far past its lease's end: the sweeper, not the TTL,
# ends it; the TTL ends it if the node forgot the lease.
TIMEOUT_MARGIN_S = 60


def check_lease_s(lease_s: float) -> float:
    if isinstance(lease_s, bool) or not MIN_LEASE_S <= lease_s <= MAX_LEASE_S:
        raise InvalidRequest(f"lease_s must be between {MIN_LEASE_S:g} and {MAX_LEASE_S:g}")
    return float(lease_s)


@dataclass
class Lease:
    lease_id: str
    team_id: str
    lease_s: float
    expires: float  # clock() time
    groups: set[str] = field(default_factory=set)
    sandboxes: set[str] = field(default_factory=set)

    def to_json(self, now: float) -> dict[str, object]:
        left = max(0.0, self.expires - now)
        at = datetime.fromtimestamp(time.time() + left, UTC)
        return {"leaseID": self.lease_id, "leaseS": self.lease_s,
                "expiresAt": at.isoformat().replace("+00:00", "Z"),
                "remainingS": round(left, 3),
                "groups": sorted(self.groups), "sandboxes": sorted(self.sandboxes)}


class Leases:
    """The node's leases, by id, in memory."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._leases: dict[str, Lease] = {}

    def new(self, team_id: str, lease_s: float) -> Lease:
        lease_s = check_lease_s(lease_s)
        lease = Lease("lease-" + secrets.token_hex(8), team_id, lease_s,
                      self.clock() + lease_s)  # fmt: skip
        self._leases[lease.lease_id] = lease
        return lease

    def get(self, lease_id: str, team_id: str) -> Lease:
        lease = self._leases.get(lease_id)
        if lease is None or lease.team_id != team_id or lease.expires <= self.clock():
            raise NotFound(f"lease \"{lease_id}\" doesn't exist or has lapsed")
        return lease

    def renew(self, lease_id: str, team_id: str) -> Lease:
        lease = self.get(lease_id, team_id)
        lease.expires = self.clock() + lease.lease_s
        return lease

    def remove(self, lease_id: str) -> Lease | None:
        return self._leases.pop(lease_id, None)

    def lapsed(self) -> list[Lease]:
        """Leases past their end, taken out of the table."""
        now = self.clock()
        gone = [le for le in self._leases.values() if le.expires <= now]
        for le in gone:
            del self._leases[le.lease_id]
        return gone

    def holder_of_sandbox(self, sandbox_id: str) -> Lease | None:
        return next((le for le in self._leases.values() if sandbox_id in le.sandboxes), None)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self._leases.values()))

    def __len__(self) -> int:
        return len(self._leases)
