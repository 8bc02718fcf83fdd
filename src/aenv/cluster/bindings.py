"""A node keeps the cluster's bindings of its own sandboxes true (`placement.py` has the
keys): every sandbox it holds is bound to it, including those created on it directly, and
its reservation is what they hold.

The node's sandbox records are the truth. Every `interval_s` (and at once when asked, e.g.
after a create) the node compares them with the bindings in etcd that name it and writes
the difference, together with its reservation, in one transaction guarded by the
revisions it read. The reservation is read first: a gateway's placement that lands after
that read changes it, the transaction fails, and the next round includes the placement.
(Read after the bindings, a placement between the two reads was lost from the count: the
race test caught that.)

- A record in a state that holds capacity (running, starting) binds with `holds`; a paused
  one stays bound without holding. A record that is gone has its binding deleted.
- A binding a gateway placed on this node (`pending`) and that the node has no record of is
  a create on its way: it is kept, holding, for `pending_grace_s`, then dropped. Unless the
  sandbox already ended here (`ended`): created and killed between two rounds, it is gone.
- A binding of one of its sandboxes that names another node is left alone. If the sandbox
  is paused here, another node took it over while this one was cut off (fenced): its copy
  here is freed (`free`). If it runs here, that is a fault to look at, and it is logged.

Pauses and resumes do not wait on etcd: the node admits them itself (its own limits are
the hard ones) and the reservation follows within a round.

The node's share of each team's usage (`<prefix>team-usage/<team>/<node>`, what placements
check team limits against) is written in the same transaction, from the same bindings: a
team's key is rewritten when its sandboxes here change, and removed when it has none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from aenv.cluster.etcd import Etcd, EtcdError, compare_mod, compare_version, delete_op, put_op
from aenv.cluster.placement import (
    Binding,
    Reservation,
    binding_key,
    reservation_key,
    team_usage_key,
    team_usage_prefix,
)
from aenv.tasks import cancel
from aenv.teams.model import DEFAULT_TEAM

log = logging.getLogger("aenv.cluster")

MAX_OPS = 120  # etcd's default --max-txn-ops is 128: the reservation and a few to spare
# A round whose records and reservation are as the last settled round left them reads one
# key, not every binding; this often the bindings are read anyway (to mend manual edits).
FULL_EVERY_S = 30.0


@dataclass(frozen=True, slots=True)
class Held:
    """What a node's record says of one sandbox."""

    memory_mib: int
    template: str
    holds: bool
    team: str = DEFAULT_TEAM


class NodeBindings:
    def __init__(self, etcd: Etcd, prefix: str, node: str,
                 records: Callable[[], dict[str, Held]], *, interval_s: float = 1.0,
                 pending_grace_s: float = 120.0,
                 free: Callable[[str], Awaitable[None]] | None = None,
                 ended: Callable[[str], bool] = lambda _sid: False) -> None:
        self.etcd, self.prefix, self.node = etcd, prefix, node
        self._records = records
        # Whether a sandbox ended on this node: its pending binding is no create on its way
        # (ids are never reused), and holding it for the grace fills the node's reservation.
        self._ended = ended
        # Called for a sandbox of this node, not holding capacity (paused), that is bound
        # to another node: taken over while this node was cut off. Its copy here goes.
        self._free = free
        self.interval_s = interval_s
        self.pending_grace_s = pending_grace_s
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # (records, reservation revision, when) after a round that left etcd matching and
        # no placement pending: nothing can differ until one of the first two changes (every
        # placement and release on this node changes the reservation).
        self._settled: tuple[dict[str, Held], int, float] | None = None

    def kick(self) -> None:
        """Reconcile now rather than at the next interval."""
        self._kick.set()

    async def start(self) -> None:
        await self.reconcile()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="aenv-bindings")

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation
            # that arrives as the event is set (a kick during shutdown), and stop() hangs.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._kick.wait()
            self._kick.clear()
            try:
                while not await self.reconcile():
                    await asyncio.sleep(0.01)  # lost to a placement: read again
            except EtcdError as e:
                log.warning("bindings of %s: %s", self.node, e)

    async def reconcile(self) -> bool:
        """One round. True if etcd now matches (or nothing was to write); False if a
        concurrent write won and another round is needed."""
        records = self._records()
        # The reservation first: a placement that lands after this read changes it, so the
        # guard below fails and the round is done again with that placement's binding.
        rkey = reservation_key(self.prefix, self.node)
        rkv = await self.etcd.get(rkey)
        rev = rkv.mod_revision if rkv else 0
        last = self._settled
        if last and last[:2] == (records, rev) and time.monotonic() - last[2] < FULL_EVERY_S:
            return True
        kvs, _ = await self.etcd.get_prefix(f"{self.prefix}bindings/")
        mine: dict[str, tuple[Binding, int]] = {}
        elsewhere: set[str] = set()
        for kv in kvs:
            sid = kv.key.rsplit("/", 1)[1]
            try:
                b = Binding.model_validate_json(kv.value)
            except ValidationError:
                continue
            if b.node == self.node:
                mine[sid] = (b, kv.mod_revision)
            elif sid in records:
                elsewhere.add(sid)
                if self._free is not None and not records[sid].holds:
                    log.warning("sandbox %s was taken over by node %s: freeing it here",
                                sid, b.node)  # fmt: skip
                    await self._free(sid)
                else:
                    log.error("sandbox %s is bound to node %s, but this node (%s) holds it",
                              sid, b.node, self.node)  # fmt: skip
        compare: list[dict[str, Any]] = []
        ops: list[dict[str, Any]] = []
        final: dict[str, Binding] = {}
        now = time.time()
        for sid, held in records.items():
            if sid in elsewhere:
                continue
            want = Binding(node=self.node, memory_mib=held.memory_mib, template=held.template,
                           holds=held.holds, team=held.team)  # fmt: skip
            final[sid] = want
            have = mine.get(sid)
            if have is None or have[0] != want:
                key = binding_key(self.prefix, sid)
                compare.append(compare_mod(key, "EQUAL", have[1]) if have else
                               compare_version(key, "EQUAL", 0))  # fmt: skip
                ops.append(put_op(key, want.model_dump_json()))
        for sid, (b, rev) in mine.items():
            if sid in records:
                continue
            if b.pending and now - b.placed_at < self.pending_grace_s and not self._ended(sid):
                final[sid] = b  # a gateway's create on its way here
                continue
            key = binding_key(self.prefix, sid)
            compare.append(compare_mod(key, "EQUAL", rev))
            ops.append(delete_op(key))
        reservation = Reservation(
            sandboxes=sum(1 for b in final.values() if b.holds),
            memory_mib=sum(b.memory_mib for b in final.values() if b.holds),
        )
        settled = not any(b.pending for b in final.values())
        await self._team_usage(final, compare, ops)
        if not ops and rkv is not None and rkv.value == reservation.model_dump_json().encode():
            self._settle(records, rev, settled)
            return True
        rest = len(ops) > MAX_OPS  # a large backlog: part now, the rest next round
        compare, ops = compare[:MAX_OPS], ops[:MAX_OPS]
        compare.append(compare_mod(rkey, "EQUAL", rkv.mod_revision) if rkv else
                       compare_version(rkey, "EQUAL", 0))  # fmt: skip
        ops.append(put_op(rkey, reservation.model_dump_json()))
        r = await self.etcd.txn(compare, ops)
        done = r.succeeded and not rest
        if done:
            self._settle(records, r.revision, settled)
        return done

    async def _team_usage(self, final: dict[str, Binding], compare: list[dict[str, Any]],
                          ops: list[dict[str, Any]]) -> None:
        """Each team's usage here as `final` holds it: the writes that make etcd say so."""
        want: dict[str, Reservation] = {}
        for b in final.values():
            if b.holds:
                r = want.setdefault(b.team, Reservation())
                r.sandboxes += 1
                r.memory_mib += b.memory_mib
        kvs, _ = await self.etcd.get_prefix(team_usage_prefix(self.prefix))
        have = {kv.key.split("/")[-2]: kv for kv in kvs if kv.key.endswith(f"/{self.node}")}
        for team in want.keys() | have.keys():
            key, kv = team_usage_key(self.prefix, team, self.node), have.get(team)
            value = want[team].model_dump_json().encode() if team in want else None
            if kv is not None and kv.value == value:
                continue
            compare.append(compare_mod(key, "EQUAL", kv.mod_revision) if kv else
                           compare_version(key, "EQUAL", 0))  # fmt: skip
            ops.append(put_op(key, value) if value is not None else delete_op(key))

    def _settle(self, records: dict[str, Held], revision: int, settled: bool) -> None:
        self._settled = (records, revision, time.monotonic()) if settled else None

