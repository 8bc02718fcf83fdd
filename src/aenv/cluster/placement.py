"""Placement: which node a new sandbox goes to, with each node's capacity enforced by etcd.

- A node's reservation (`<prefix>reservations/<node>`: sandboxes and memory placed on it) and
  a sandbox's binding (`<prefix>bindings/<sandbox id>`: its node) are written in **one etcd
  transaction**, guarded by the reservation's last modification revision. Two gateways that
  choose the same node at once cannot both succeed: the loser reads again and chooses again.
  So however many place at once, no node goes over its `max_sandboxes` or memory budget.
- The choice itself is a `Placement` policy (`choose(request, nodes) -> node | None`);
  `PreferLocal` is the default: nodes that hold the template or snapshot first, then the
  least loaded.
- `release` removes a binding and gives its reservation back, in one transaction too.
- A team with limits (teams/) has its usage per node at `<prefix>team-usage/<team>/<node>`.
  A placement for it reads the team's keys, refuses (`TeamLimitReached`) when one more
  sandbox or its memory would pass a limit, and otherwise adds itself to the chosen node's
  key in the same transaction, guarded on the whole range: a key of the team written since
  the read (another placement, a node's reconcile) makes it read again. So a team spread
  over many nodes and gateways stays within its limits. Nodes keep the keys true
  (`bindings.py`).
- Sandboxes no placement made (forks' children, a sandbox woken by traffic) are counted by
  a **hold** (`hold`, `team_holds.py`): a key of the team's usage range on a lease, taken
  with the same check and guard, which every placement counts until it goes.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel, ValidationError

from aenv.cluster.etcd import (
    Etcd,
    EtcdError,
    KeyValue,
    compare_mod,
    compare_range_mod_below,
    compare_version,
    delete_op,
    put_op,
)
from aenv.cluster.membership import NodeRecord
from aenv.teams.model import DEFAULT_TEAM

log = logging.getLogger("aenv.cluster")

ATTEMPTS = 64  # transactions lost to other placers before giving up (then 503)
BACKOFF_S = 0.005  # up to this, at random, after a lost transaction: the losers spread out
HOLD_MARK = "@hold-"  # node names are DNS labels (identity.py): no node is named so


class AlreadyBound(EtcdError):
    """The sandbox id is bound already (ids are never reused; an idempotent retry finds
    its first try's binding)."""


class PlacementFailed(Exception):
    """No node can take the sandbox (all full or draining), or too much contention."""


class TeamLimitReached(Exception):
    """The sandbox's team is at one of its limits across the cluster: not worth a retry."""


class Reservation(BaseModel):
    """What placements have committed on one node."""

    sandboxes: int = 0
    memory_mib: int = 0


class Binding(BaseModel):
    """Where a sandbox lives, and what it reserved there.

    `pending`: placed by a gateway, not yet created by the node (which then rewrites it).
    `holds`: it counts in its node's reservation (running or starting, or pending); a
    paused sandbox stays bound to its node without holding capacity there."""

    node: str
    memory_mib: int
    template: str = ""
    holds: bool = True
    pending: bool = False
    placed_at: float = 0.0
    team: str = DEFAULT_TEAM


@dataclass(frozen=True, slots=True)
class TeamQuota:
    """A team's limits (None: none), as the placement enforces them cluster-wide."""

    team: str
    name: str
    max_sandboxes: int | None = None
    max_memory_mib: int | None = None

    @property
    def limited(self) -> bool:
        return self.max_sandboxes is not None or self.max_memory_mib is not None


@dataclass(frozen=True, slots=True)
class PlacementRequest:
    sandbox_id: str
    memory_mib: int
    template: str = ""  # a template or snapshot id: nodes that hold it are preferred
    quota: TeamQuota | None = None  # the sandbox's team (None: the default team, no limits)

    @property
    def team(self) -> str:
        return self.quota.team if self.quota is not None else DEFAULT_TEAM


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as a policy sees it: its record and what is already reserved on it."""

    record: NodeRecord
    reserved: Reservation

    def fits(self, req: PlacementRequest) -> bool:
        cap = self.record.capacity
        return (not self.record.draining
                and self.reserved.sandboxes + 1 <= cap.max_sandboxes
                and self.reserved.memory_mib + req.memory_mib <= cap.memory_mib)  # fmt: skip

    def load(self) -> float:
        cap = self.record.capacity
        return max(self.reserved.sandboxes / max(cap.max_sandboxes, 1),
                   self.reserved.memory_mib / max(cap.memory_mib, 1))  # fmt: skip


class Placement(Protocol):
    def choose(self, req: PlacementRequest, nodes: Sequence[NodeView]) -> NodeView | None:
        """The node to place `req` on, among those that fit it; None if none does."""
        ...


class PreferLocal:
    """Nodes holding the template or snapshot first (no transfer), then the least loaded;
    ties by name, so the choice is the same on every gateway."""

    def choose(self, req: PlacementRequest, nodes: Sequence[NodeView]) -> NodeView | None:
        fitting = [n for n in nodes if n.fits(req)]
        if not fitting:
            return None

        def key(n: NodeView) -> tuple[bool, float, str]:
            local = bool(req.template) and n.record.holds(req.template)
            return (not local, n.load(), n.record.name)

        return min(fitting, key=key)


def reservation_key(prefix: str, node: str) -> str:
    return f"{prefix}reservations/{node}"


def binding_key(prefix: str, sandbox_id: str) -> str:
    return f"{prefix}bindings/{sandbox_id}"


def team_usage_prefix(prefix: str, team: str = "") -> str:
    return f"{prefix}team-usage/{team}/" if team else f"{prefix}team-usage/"


def team_usage_key(prefix: str, team: str, node: str) -> str:
    return f"{team_usage_prefix(prefix, team)}{node}"


@dataclass(frozen=True, slots=True)
class _TeamRead:
    """A limited team's usage as read: per node (with mod revisions), and the read's
    revision (the range guard)."""

    usage: dict[str, tuple[Reservation, int]]
    revision: int

    def total(self) -> Reservation:
        return Reservation(sandboxes=sum(r.sandboxes for r, _ in self.usage.values()),
                           memory_mib=sum(r.memory_mib for r, _ in self.usage.values()))


async def _read_team(etcd: Etcd, prefix: str, q: TeamQuota | None, vms: int,
                     memory_mib: int) -> _TeamRead | None:  # fmt: skip
    """A limited team's usage, read; TeamLimitReached if `vms` more sandboxes of
    `memory_mib` MiB in all would pass one of its limits. None for a team without limits."""
    if q is None or not q.limited:
        return None
    kvs, revision = await etcd.get_prefix(team_usage_prefix(prefix, q.team))
    read = _TeamRead({kv.key.rsplit("/", 1)[1]: (_reservation(kv), kv.mod_revision)
                      for kv in kvs}, revision)  # fmt: skip
    used = read.total()
    if q.max_sandboxes is not None and used.sandboxes + vms > q.max_sandboxes:
        raise TeamLimitReached(f"team {q.name} may run {q.max_sandboxes} sandboxes at once "
                               f"and runs {used.sandboxes} across the cluster"
                               + (f" ({vms} more asked)" if vms > 1 else ""))  # fmt: skip
    if q.max_memory_mib is not None and used.memory_mib + memory_mib > q.max_memory_mib:
        raise TeamLimitReached(f"team {q.name} may use {q.max_memory_mib} MiB at once and "
                               f"uses {used.memory_mib} MiB across the cluster "
                               f"({memory_mib} MiB asked)")  # fmt: skip
    return read


def hold_key(prefix: str, team: str, hold_id: str) -> str:
    """A hold's key in the team's usage range: its last part is no node's name."""
    return team_usage_key(prefix, team, f"{HOLD_MARK}{hold_id}")


async def hold(etcd: Etcd, prefix: str, quota: TeamQuota, vms: int, memory_mib: int,
               hold_id: str, lease: int) -> str:
    """Take `vms` places of `memory_mib` MiB in all for a limited team, as a key of its
    usage range on `lease` (which every placement counts): the same check and the same
    range guard as a placement's. TeamLimitReached if they would pass a limit; the key."""
    key = hold_key(prefix, quota.team, hold_id)
    value = Reservation(sandboxes=vms, memory_mib=memory_mib).model_dump_json()
    for _ in range(ATTEMPTS):
        team = await _read_team(etcd, prefix, quota, vms, memory_mib)
        assert team is not None
        r = await etcd.txn([compare_range_mod_below(team_usage_prefix(prefix, quota.team),
                                                    team.revision + 1)],
                           [put_op(key, value, lease)])  # fmt: skip
        if r.succeeded:
            return key
        await asyncio.sleep(random.uniform(0, BACKOFF_S))
    raise PlacementFailed(f"a hold for team {quota.name} lost {ATTEMPTS} transactions in a row")


async def reservations(etcd: Etcd, prefix: str) -> dict[str, Reservation]:
    """What placements and nodes have reserved, by node."""
    return {node: r for node, (r, _) in (await _reservations(etcd, prefix)).items()}


async def _reservations(etcd: Etcd, prefix: str) -> dict[str, tuple[Reservation, int]]:
    """Each node's reservation and its mod revision (0: none written yet)."""
    kvs, _ = await etcd.get_prefix(f"{prefix}reservations/")
    out = {}
    for kv in kvs:
        out[kv.key.rsplit("/", 1)[1]] = (_reservation(kv), kv.mod_revision)
    return out


def _reservation(kv: KeyValue | None) -> Reservation:
    if kv is None:
        return Reservation()
    try:
        return Reservation.model_validate_json(kv.value)
    except ValidationError:
        log.warning("reservation %s does not parse: counted as empty", kv.key)
        return Reservation()


def _less(r: Reservation, gone: Reservation) -> Reservation:
    return Reservation(sandboxes=max(r.sandboxes - gone.sandboxes, 0),
                       memory_mib=max(r.memory_mib - gone.memory_mib, 0))


def _guard(key: str, revision: int) -> dict[str, object]:
    # A reservation never written has version 0; a written one must be unchanged since read.
    return compare_version(key, "EQUAL", 0) if revision == 0 else \
        compare_mod(key, "EQUAL", revision)


async def place(etcd: Etcd, prefix: str, nodes: Sequence[NodeRecord], req: PlacementRequest,
                policy: Placement | None = None, *, replacing: int = 0) -> NodeRecord:
    """Choose a node for `req` and commit its binding and reservation, or PlacementFailed.
    A sandbox id already bound is refused (AlreadyBound): ids are never reused. Except
    `replacing`, the mod revision of its binding as read: a paused sandbox moving to another
    node (its binding holds nothing), refused if the binding changed since."""
    policy = policy or PreferLocal()
    bkey = binding_key(prefix, req.sandbox_id)
    for _ in range(ATTEMPTS):
        team = await _read_team(etcd, prefix, req.quota, 1, req.memory_mib)
        reserved = await _reservations(etcd, prefix)
        views = [NodeView(n, reserved.get(n.name, (Reservation(), 0))[0]) for n in nodes]
        chosen = policy.choose(req, views)
        if chosen is None:
            raise PlacementFailed("no node has room for the sandbox "
                                  f"({len(nodes)} nodes, {req.memory_mib} MiB asked)")
        name = chosen.record.name
        rkey = reservation_key(prefix, name)
        now, revision = reserved.get(name, (Reservation(), 0))
        after = Reservation(sandboxes=now.sandboxes + 1, memory_mib=now.memory_mib + req.memory_mib)
        binding = Binding(node=name, memory_mib=req.memory_mib, template=req.template,
                          pending=True, placed_at=time.time(), team=req.team)
        unchanged = compare_mod(bkey, "EQUAL", replacing) if replacing else \
            compare_version(bkey, "EQUAL", 0)
        compare = [_guard(rkey, revision), unchanged]
        ops = [put_op(rkey, after.model_dump_json()), put_op(bkey, binding.model_dump_json())]
        if team is not None:
            tprefix = team_usage_prefix(prefix, req.team)
            mine = team.usage.get(name, (Reservation(), 0))[0]
            compare.append(compare_range_mod_below(tprefix, team.revision + 1))
            ops.append(put_op(team_usage_key(prefix, req.team, name), Reservation(
                sandboxes=mine.sandboxes + 1,
                memory_mib=mine.memory_mib + req.memory_mib).model_dump_json()))
        r = await etcd.txn(compare, ops)
        if r.succeeded:
            return chosen.record
        kv = await etcd.get(bkey)
        if kv is not None and not (replacing and kv.mod_revision == replacing):
            if kv.value == binding.model_dump_json().encode():
                return chosen.record  # ours: applied by a try the client retried
            raise AlreadyBound(f"sandbox {req.sandbox_id} is already bound")
        await asyncio.sleep(random.uniform(0, BACKOFF_S))
    raise PlacementFailed(f"placement lost {ATTEMPTS} transactions in a row to other placers")


async def binding(etcd: Etcd, prefix: str, sandbox_id: str) -> Binding | None:
    kv = await etcd.get(binding_key(prefix, sandbox_id))
    return Binding.model_validate_json(kv.value) if kv is not None else None


async def release(etcd: Etcd, prefix: str, sandbox_id: str) -> bool:
    """Remove `sandbox_id`'s binding and give back what it reserved. False if unbound."""
    bkey = binding_key(prefix, sandbox_id)
    for _ in range(ATTEMPTS):
        bkv = await etcd.get(bkey)
        if bkv is None:
            return False
        b = Binding.model_validate_json(bkv.value)
        rkey = reservation_key(prefix, b.node)
        rkv = await etcd.get(rkey)
        now = _reservation(rkv)
        gone = Reservation(sandboxes=1, memory_mib=b.memory_mib) if b.holds else Reservation()
        compare = [compare_mod(bkey, "EQUAL", bkv.mod_revision),
                   _guard(rkey, rkv.mod_revision if rkv else 0)]
        ops = [delete_op(bkey), put_op(rkey, _less(now, gone).model_dump_json())]
        tkey = team_usage_key(prefix, b.team, b.node)
        tkv = await etcd.get(tkey) if b.holds else None
        if tkv is not None:  # the team's usage on that node, given back in the same step
            compare.append(compare_mod(tkey, "EQUAL", tkv.mod_revision))
            ops.append(put_op(tkey, _less(_reservation(tkv), gone).model_dump_json()))
        r = await etcd.txn(compare, ops)
        if r.succeeded:
            return True
        await asyncio.sleep(random.uniform(0, BACKOFF_S))
    raise PlacementFailed(f"release lost {ATTEMPTS} transactions in a row")
