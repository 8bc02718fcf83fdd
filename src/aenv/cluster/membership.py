"""Cluster membership in etcd: each node registers itself under a lease and keeps it alive;
gateways (and `aenv cluster status`) read and watch the records.

- A node's record is `<prefix>nodes/<name>`, a JSON `NodeRecord`, attached to the node's
  lease (`cluster_lease_ttl_s`, 10 s by default). A node that dies stops renewing it and
  etcd removes the record when the lease expires: that is how a node is lost within the TTL.
- The node renews the lease every sixth of the TTL and, apart, republishes the record when what it
  reports changes (usage, templates, snapshots), at most every `publish_every_s`.
- If its lease has expired anyway (etcd unreachable for longer than the TTL, then back),
  the node takes a new lease and registers again.
- `Members` keeps a current view of every record: a read, then a watch from the revision
  it was read at; after a broken watch it reads again. Adding or removing a node needs no
  restart of whoever watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from pydantic import BaseModel, Field, ValidationError

from aenv.cluster.etcd import Etcd, EtcdError, EtcdUnavailable
from aenv.cluster.lease import LeaseKeeper
from aenv.cluster.view import PrefixView
from aenv.tasks import cancel

log = logging.getLogger("aenv.cluster")

RETRY_S = 1.0  # after etcd was unreachable
RENEW_PARTS = 6  # renewals per lease TTL
# A renewing thread renews while the node's loop turned within this part of the TTL: the node
# fences at half of it (cluster/node.py FENCE_AT), so a stuck loop does not outlive its lease.
ALIVE_PART = 0.5


class Capacity(BaseModel):
    max_sandboxes: int
    # Nominal RAM a placement may reserve there: the node's memory budget for sandboxes x
    # its memory_overcommit (the node itself then admits by what they hold, measured).
    memory_mib: int
    budget_mib: int = 0  # the memory budget itself


class Usage(BaseModel):
    sandboxes: int = 0  # those that hold capacity (running, or starting)
    memory_mib: int = 0  # their memory
    hot_paused: int = 0  # stopped VMMs kept for a fast resume (machines/hot.py)
    hot_rss_mib: int = 0
    held_mib: int = 0  # what running and hot VMMs hold, measured (PSS)


class NodeRecord(BaseModel):
    """What a node publishes about itself (`<prefix>nodes/<name>`)."""

    name: str
    url: str  # where gateways reach its API, control and data plane
    version: str
    accelerator: str | None = None  # kvm or tcg
    kernel: str = ""  # cache keys: a snapshot restores only where they match
    tools: str = ""
    capacity: Capacity
    usage: Usage = Field(default_factory=Usage)
    templates: list[str] = Field(default_factory=list)
    snapshots: list[str] = Field(default_factory=list)  # its own (taken here)
    cached: list[str] = Field(default_factory=list)  # copies it fetched from elsewhere
    # Ids and names of its own snapshots, which peers may fetch from it.
    shared: list[str] = Field(default_factory=list)
    # Every name a create may give here (template ids and aliases, snapshot ids and names)
    # and the memory it reserves: what placement reserves before the node is asked.
    memory_of: dict[str, int] = Field(default_factory=dict)
    draining: bool = False
    started_at: float = 0.0
    updated_at: float = 0.0

    def holds(self, name: str) -> bool:
        """Whether a create of template or snapshot `name` needs no transfer here."""
        return (name in self.memory_of or name in self.templates or name in self.snapshots
                or name in self.cached)  # fmt: skip

    def content(self) -> dict[str, object]:
        """The record without its timestamp: what a republish compares."""
        return self.model_dump(exclude={"updated_at"})


def nodes_prefix(prefix: str) -> str:
    return f"{prefix}nodes/"


async def others(etcd: Etcd, prefix: str, node: str) -> list[NodeRecord]:
    """The member records of every node but `node`, read from etcd now."""
    kvs, _ = await etcd.get_prefix(nodes_prefix(prefix))
    out = []
    for kv in kvs:
        with contextlib.suppress(ValueError):
            rec = NodeRecord.model_validate_json(kv.value)
            if rec.name != node:
                out.append(rec)
    return out


class Registration:
    """Keeps one node's record in etcd while the node runs (see the module docstring)."""

    def __init__(self, etcd: Etcd, prefix: str, record: Callable[[], NodeRecord], *,
                 ttl_s: int = 10, publish_every_s: float = 2.0,
                 renew_with: Callable[[], Etcd] | None = None) -> None:  # fmt: skip
        """`renew_with`: a maker of etcd clients; given, the lease is renewed from a thread
        of its own with one (cluster/lease.py), else from the event loop with `etcd`."""
        self.etcd = etcd
        self._renew_with = renew_with
        self.ttl_s = ttl_s
        self.publish_every_s = publish_every_s
        self._record = record
        self._prefix = prefix
        self.lease = 0
        self._published: dict[str, object] | None = None
        self._task: asyncio.Task[None] | None = None
        # When the lease was last known alive (monotonic): a node that cannot renew it
        # knows how long it still holds it.
        self.renewed_at = 0.0

    @property
    def key(self) -> str:
        return nodes_prefix(self._prefix) + self._record().name

    async def start(self) -> None:
        """Register, or raise EtcdError: a node configured for a cluster that cannot reach
        etcd at start-up fails to start rather than run unseen."""
        await self._register()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="aenv-membership")

    async def _register(self) -> None:
        asked = time.monotonic()  # the lease runs from no earlier than this
        self.lease = await self.etcd.grant(self.ttl_s)
        self.renewed_at = asked
        self._published = None
        await self.publish()
        log.info("registered %s in etcd (lease %x, ttl %d s)", self.key, self.lease, self.ttl_s)

    async def publish(self, *, force: bool = False) -> bool:
        """Write the record if it changed (or `force`). True if it was written."""
        rec = self._record()
        content = rec.content()
        if not force and content == self._published:
            return False
        rec.updated_at = time.time()
        await self.etcd.put(self.key, rec.model_dump_json(), lease=self.lease)
        self._published = content
        return True

    async def _run(self) -> None:
        # Renewal has its own task, or thread: a slow publish (a large record to a loaded
        # etcd) must not hold the lease's renewal back, which fences the node (cluster/node.py).
        keeper = None if self._renew_with is None else LeaseKeeper(
            self._renew_with, lambda: self.lease, every_s=max(self.ttl_s / RENEW_PARTS, 0.2),
            alive_s=self.ttl_s * ALIVE_PART, renewed=self._renewed, expired=self._register,
            retry_s=RETRY_S)  # fmt: skip
        renewing = None
        if keeper is not None:
            keeper.start()
        else:
            renewing = asyncio.get_running_loop().create_task(self._renewing(),
                                                              name="aenv-lease")  # fmt: skip
        try:
            while True:
                await asyncio.sleep(self.publish_every_s)
                try:
                    await self.publish()
                except EtcdError as e:
                    log.warning("publishing %s: %s", self.key, e)
        finally:
            if keeper is not None:
                await keeper.stop()
            await cancel(renewing)

    def _renewed(self, asked: float) -> None:
        self.renewed_at = max(self.renewed_at, asked)

    async def _renewing(self) -> None:
        # Every RENEW_PARTS-th of the TTL: the node fences at half of it without a renewal,
        # so a loaded host's slow answers leave room for two more tries before that.
        renew_every = max(self.ttl_s / RENEW_PARTS, 0.2)
        wait = renew_every
        while True:
            await asyncio.sleep(wait)
            wait = renew_every
            try:
                asked = time.monotonic()
                if await self.etcd.keepalive(self.lease) <= 0:
                    log.warning("lease of %s expired: registering again", self.key)
                    await self._register()
                else:
                    self.renewed_at = asked
                    if (took := time.monotonic() - asked) > renew_every:
                        log.warning("renewing the lease of %s took %.1f s", self.key, took)
            except EtcdUnavailable as e:
                log.warning("etcd unreachable (%s); lease held for %.1f s more", e,
                            self.ttl_s - (time.monotonic() - self.renewed_at))  # fmt: skip
                wait = min(RETRY_S, renew_every)
            except EtcdError as e:
                log.warning("membership of %s: %s", self.key, e)
                wait = min(RETRY_S, renew_every)

    async def stop(self) -> None:
        """Leave the cluster: the record goes with the lease."""
        await cancel(self._task)
        self._task = None
        if self.lease:
            with contextlib.suppress(EtcdError):
                await self.etcd.revoke(self.lease)
            self.lease = 0


class Members(PrefixView[NodeRecord]):
    """The current records of every node, kept up to date by a watch."""

    def __init__(self, etcd: Etcd, prefix: str) -> None:
        super().__init__(etcd, nodes_prefix(prefix), _parse)

    @property
    def nodes(self) -> dict[str, NodeRecord]:
        return self.items


def _parse(raw: bytes) -> NodeRecord | None:
    try:
        return NodeRecord.model_validate_json(raw)
    except ValidationError as e:
        log.warning("ignoring a node record that does not parse: %s", e)
        return None
