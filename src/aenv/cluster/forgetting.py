"""Nodes that never come back (docs/cluster.md, "Failure handling").

A lost node's bindings and reservation stay in etcd: its sandboxes answer 404 meanwhile, and
a node that comes back reconciles them (`bindings.py`). One that never comes back would
leave them for good. So every node, once a minute, looks for nodes that bindings or
reservations name but that have no member record:

- The first round that sees such a node writes `<prefix>lost/<node>` with the time (only if
  absent: of several nodes looking, the first one's time stands).
- Once a node has been absent for `cluster.forget_lost_after_s`, its bindings are deleted,
  each guarded by the revision read and by the node's record still being absent (a node
  registering meanwhile keeps everything), and then its reservation. Bindings of sandboxes
  whose paused state is published (`<prefix>paused/<id>`) stay: those sandboxes resume on
  another node, which moves the binding. Its share of each team's usage goes too.
- A node that registers again has its mark deleted.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from aenv.cluster.etcd import Etcd, KeyValue, compare_mod, compare_version, delete_op, put_op
from aenv.cluster.membership import nodes_prefix
from aenv.cluster.placement import (
    HOLD_MARK,
    Binding,
    binding_key,
    reservation_key,
    team_usage_prefix,
)
from aenv.cluster.published import paused_prefix

log = logging.getLogger("aenv.cluster")

EVERY_S = 60.0
MAX_OPS = 120  # etcd's default --max-txn-ops is 128


def lost_prefix(prefix: str) -> str:
    return f"{prefix}lost/"


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What one round did."""

    marked: list[str]  # nodes first seen absent
    returned: list[str]  # nodes whose mark went: they registered again
    bindings: list[str]  # sandbox ids whose bindings were deleted
    reservations: list[str]  # nodes whose reservation was deleted


class Forgetting:
    def __init__(self, etcd: Etcd, prefix: str, after_s: float,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.etcd, self.prefix, self.after_s, self.clock = etcd, prefix, after_s, clock

    async def round(self) -> Forgotten:
        p = self.prefix
        members = {_tail(kv) for kv in await self._all(nodes_prefix(p))}
        marks = {_tail(kv): kv for kv in await self._all(lost_prefix(p))}
        paused = {_tail(kv) for kv in await self._all(paused_prefix(p))}
        reservations = {_tail(kv): kv for kv in await self._all(reservation_key(p, ""))}
        bindings: dict[str, tuple[Binding, int]] = {}
        for kv in await self._all(binding_key(p, "")):
            try:
                bindings[_tail(kv)] = (Binding.model_validate_json(kv.value), kv.mod_revision)
            except ValidationError:
                continue
        usage: dict[str, list[KeyValue]] = {}  # node -> its share of each team's usage
        for kv in await self._all(team_usage_prefix(p)):
            if not _tail(kv).startswith(HOLD_MARK):  # holds end with their leases
                usage.setdefault(_tail(kv), []).append(kv)
        absent = ({b.node for b, _ in bindings.values()} | set(reservations) | set(usage)
                  ) - members  # fmt: skip
        out = Forgotten([], [], [], [])
        for node, kv in marks.items():
            if node not in absent and (await self.etcd.txn(
                    [compare_mod(kv.key, "EQUAL", kv.mod_revision)], [delete_op(kv.key)])
                    ).succeeded:  # fmt: skip
                out.returned.append(node)
        now = self.clock()
        for node in sorted(absent):
            mark = marks.get(node)
            if mark is None:
                key = lost_prefix(p) + node
                if (await self.etcd.txn([compare_version(key, "EQUAL", 0)],
                                        [put_op(key, json.dumps({"since": now}))])).succeeded:
                    out.marked.append(node)
                continue
            if now - _since(mark) < self.after_s:
                continue
            await self._forget(node, bindings, paused, reservations.get(node), out)
            await self._forget_usage(node, usage.get(node, []))
        return out

    async def _forget(self, node: str, bindings: dict[str, tuple[Binding, int]],
                      paused: set[str], reservation: KeyValue | None, out: Forgotten) -> None:
        p = self.prefix
        absent = compare_version(nodes_prefix(p) + node, "EQUAL", 0)
        doomed = sorted(sid for sid, (b, _) in bindings.items()
                        if b.node == node and sid not in paused)  # fmt: skip
        for i in range(0, len(doomed), MAX_OPS):
            batch = doomed[i:i + MAX_OPS]
            guards = [compare_mod(binding_key(p, sid), "EQUAL", bindings[sid][1])
                      for sid in batch]  # fmt: skip
            res = await self.etcd.txn([absent, *guards],
                                      [delete_op(binding_key(p, sid)) for sid in batch])
            if res.succeeded:
                out.bindings.extend(batch)
        if reservation is not None:
            res = await self.etcd.txn(
                [absent, compare_mod(reservation.key, "EQUAL", reservation.mod_revision)],
                [delete_op(reservation.key)])  # fmt: skip
            if res.succeeded:
                out.reservations.append(node)
        if out.bindings or out.reservations:
            log.warning("node %s absent for %.0f s: forgot %d bindings%s", node, self.after_s,
                        sum(1 for s in out.bindings if bindings[s][0].node == node),
                        " and its reservation" if node in out.reservations else "")  # fmt: skip

    async def _forget_usage(self, node: str, kvs: list[KeyValue]) -> None:
        """The node's share of its teams' usage: nothing runs there any more."""
        absent = compare_version(nodes_prefix(self.prefix) + node, "EQUAL", 0)
        for kv in kvs:
            await self.etcd.txn([absent, compare_mod(kv.key, "EQUAL", kv.mod_revision)],
                                [delete_op(kv.key)])  # fmt: skip

    async def _all(self, prefix: str) -> list[KeyValue]:
        kvs, _ = await self.etcd.get_prefix(prefix)
        return kvs


def _tail(kv: KeyValue) -> str:
    return kv.key.rsplit("/", 1)[1]


def _since(kv: KeyValue) -> float:
    try:
        return float(json.loads(kv.value)["since"])
    except (ValueError, KeyError, TypeError):
        return 0.0  # unreadable: as old as can be
