"""Cluster membership in etcd: each node registers itself under a lease and keeps it alive;
gateways (and `aenv cluster status`) read and watch the records.

- A node's record is `<prefix>nodes/<name>`, a JSON `NodeRecord`, attached to the node's
  lease (`cluster_lease_ttl_s`, 10 s by default). A node that dies stops renewing it and
  etcd removes the record when the lease expires: that is how a node is lost within the TTL.
- The node renews the lease every third of the TTL and republishes the record when what it
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
from aenv.tasks import cancel

log = logging.getLogger("aenv.cluster")

RETRY_S = 1.0  # after etcd was unreachable


class Capacity(BaseModel):
    max_sandboxes: int
    memory_mib: int  # the node's memory budget for sandboxes


class Usage(BaseModel):
    sandboxes: int = 0  # those that hold capacity (running, or starting)
    memory_mib: int = 0  # their memory
    hot_paused: int = 0  # stopped VMMs kept for a fast resume (machines/hot.py)
    hot_rss_mib: int = 0


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
    snapshots: list[str] = Field(default_factory=list)
    draining: bool = False
    started_at: float = 0.0
    updated_at: float = 0.0

    def content(self) -> dict[str, object]:
        """The record without its timestamp: what a republish compares."""
        return self.model_dump(exclude={"updated_at"})


def nodes_prefix(prefix: str) -> str:
    return f"{prefix}nodes/"


class Registration:
    """Keeps one node's record in etcd while the node runs (see the module docstring)."""

    def __init__(self, etcd: Etcd, prefix: str, record: Callable[[], NodeRecord], *,
                 ttl_s: int = 10, publish_every_s: float = 2.0) -> None:
        self.etcd = etcd
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
        self.lease = await self.etcd.grant(self.ttl_s)
        self.renewed_at = time.monotonic()
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
        renew_every = max(self.ttl_s / 3, 0.2)
        next_renew = time.monotonic() + renew_every
        while True:
            await asyncio.sleep(min(self.publish_every_s, max(next_renew - time.monotonic(), 0)))
            try:
                if time.monotonic() >= next_renew:
                    if await self.etcd.keepalive(self.lease) <= 0:
                        log.warning("lease of %s expired: registering again", self.key)
                        await self._register()
                    self.renewed_at = time.monotonic()
                    next_renew = self.renewed_at + renew_every
                await self.publish()
            except EtcdUnavailable as e:
                log.warning("etcd unreachable (%s); lease held for %.1f s more", e,
                            self.ttl_s - (time.monotonic() - self.renewed_at))  # fmt: skip
                next_renew = time.monotonic() + RETRY_S
            except EtcdError as e:
                log.warning("membership of %s: %s", self.key, e)
                next_renew = time.monotonic() + RETRY_S

    async def stop(self) -> None:
        """Leave the cluster: the record goes with the lease."""
        await cancel(self._task)
        self._task = None
        if self.lease:
            with contextlib.suppress(EtcdError):
                await self.etcd.revoke(self.lease)
            self.lease = 0


class Members:
    """The current records of every node, kept up to date by a watch."""

    def __init__(self, etcd: Etcd, prefix: str) -> None:
        self.etcd = etcd
        self.prefix = nodes_prefix(prefix)
        self.nodes: dict[str, NodeRecord] = {}
        self._task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()  # set on every change; whoever waits clears it

    async def start(self) -> None:
        """Read every record (EtcdError if etcd cannot be reached), then follow changes."""
        revision = await self.load()
        self._task = asyncio.get_running_loop().create_task(self._run(revision),
                                                            name="aenv-members")

    async def load(self) -> int:
        kvs, revision = await self.etcd.get_prefix(self.prefix)
        nodes = {}
        for kv in kvs:
            rec = _parse(kv.value)
            if rec is not None:
                nodes[rec.name] = rec
        self.nodes = nodes
        self.changed.set()
        return revision

    async def _run(self, revision: int) -> None:
        while True:
            try:
                async for ev in self.etcd.watch_prefix(self.prefix, revision + 1):
                    revision = max(revision, ev.kv.mod_revision)
                    name = ev.kv.key[len(self.prefix):]
                    if ev.type == "DELETE":
                        self.nodes.pop(name, None)
                    elif (rec := _parse(ev.kv.value)) is not None:
                        self.nodes[name] = rec
                    self.changed.set()
            except EtcdError as e:
                log.warning("watching %s: %s; reading again", self.prefix, e)
                await asyncio.sleep(RETRY_S)
                with contextlib.suppress(EtcdError):
                    revision = await self.load()

    async def stop(self) -> None:
        await cancel(self._task)
        self._task = None


def _parse(raw: bytes) -> NodeRecord | None:
    try:
        return NodeRecord.model_validate_json(raw)
    except ValidationError as e:
        log.warning("ignoring a node record that does not parse: %s", e)
        return None
