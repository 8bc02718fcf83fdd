"""Snapshots across the nodes of a cluster (docs/cluster.md, "Snapshot store"): the node's
side of `orchestrator.snapshots.Shared`.

- **Publish.** With a snapshot store (`[store] url`), every snapshot taken here is
  published soon after (chunks, then its manifest, then its catalog entry in etcd:
  `cluster/published.py`), so that any node can create from it, even once this node is
  gone. Deleting the snapshot deletes its publication.
- **Locate.** A create (or a fork of a snapshot) naming a snapshot this node lacks asks the
  cluster: the catalog, and the peers whose records hold it. The snapshot is fetched from
  a peer that holds it (range requests on its files), falling back to the store, each chunk
  checked against its digest; chunks of the template it was made from are copied from this
  node's own files. Its compatibility with this node is checked first (store/compat.py).
- **Cache.** What was fetched is a copy (`Manifest.fetched`): not listed as this node's
  own, found only through the cluster, and least recently used first out beyond
  `[store] cache_bytes` (storage/lru.py), never while a restore from it is in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from aenv.cluster.etcd import Etcd, EtcdError
from aenv.cluster.forks import Forks
from aenv.cluster.membership import NodeRecord, nodes_prefix
from aenv.cluster.peers import PeerChunks, describe
from aenv.cluster.published import PublishedEntry, newest, parse_entry, published_key
from aenv.cluster.published import published_prefix as catalog_prefix
from aenv.cluster.takeover import Takeover
from aenv.machines.api import SnapshotInfo, TemplateNotFound
from aenv.machines.machine import FORK_PREFIX
from aenv.storage import checksums as sums
from aenv.storage import lru
from aenv.storage.extents import tree_usage
from aenv.storage.snapshots import CHECKSUMS_FILE, Manifest, SnapshotCorrupt, SnapshotNotFound
from aenv.store import compat, transfer
from aenv.store.objects import ObjectNotFound, ObjectStore, ObjectStoreError, open_store
from aenv.store.published import Published, manifest_key
from aenv.tasks import cancel

if TYPE_CHECKING:
    from aenv.config import Config
    from aenv.orchestrator.service import Orchestrator
    from aenv.orchestrator.store import SandboxRecord

log = logging.getLogger("aenv.cluster")

PUBLISHED_FILE = "published.json"  # in a snapshot's directory, once it is published
USED_FILE = "used"  # a fetched copy's last use: this file's mtime
RETRY_S = 5.0  # a publish that failed (the store out of reach) is tried again after this
LOOP_PAUSE_S = 0.5
SWEEP_EVERY_S = 60.0  # fetched copies of snapshots the cluster no longer has are dropped


class Sharing:
    def __init__(self, cfg: Config, orch: Orchestrator, etcd: Etcd, node: str) -> None:
        self.cfg = cfg
        self.orch = orch
        self.runtime: Any = orch.runtime  # machines.runtime.Runtime: it has a repository
        self.snapshots = self.runtime.snapshots
        self.etcd = etcd
        self.node = node
        self.prefix = cfg.cluster.prefix
        self.store: ObjectStore | None = open_store(
            cfg.store.url, endpoint_url=cfg.store.endpoint_url, region=cfg.store.region)
        self._pending: set[str] = set()
        self.takeover = Takeover(self)
        self.forks = Forks(self)
        self._paused: set[str] = set()  # paused sandboxes to publish
        self._ended_check = False  # records changed: entries of ended sandboxes may go
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sweep: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._fetching: dict[str, asyncio.Lock] = {}
        self.client = httpx.AsyncClient()

    def accel(self) -> str | None:
        accel = getattr(self.runtime, "accel", None)
        return accel() if callable(accel) else None

    async def start(self) -> None:
        if self.store is not None:
            self._pending.update(s.snapshot_id for s in self.orch.snapshot_list()
                                 if not (self.snapshots.path(s.snapshot_id)
                                         / PUBLISHED_FILE).exists())  # fmt: skip
            self._task = asyncio.get_running_loop().create_task(self._publishing(),
                                                                name="aenv-publish")  # fmt: skip
            self._kick.set()
        self._sweep = asyncio.get_running_loop().create_task(self._sweeping(),
                                                             name="aenv-sweep-copies")  # fmt: skip

    async def close(self) -> None:
        await cancel(self._sweep)
        await cancel(self._task)
        for t in list(self._background):
            await cancel(t)
        await self.client.aclose()

    # -- what the record says ---------------------------------------------------------------

    def cached(self) -> list[str]:
        """Copies fetched here (peers may fetch from them too)."""
        return sorted(s.snapshot_id for s in self.runtime.list_snapshots() if s.fetched)

    # -- Shared ------------------------------------------------------------------------------

    def taken(self, snap: SnapshotInfo) -> None:
        if self.store is not None:
            self._pending.add(snap.snapshot_id)
            self._kick.set()

    def paused(self, rec: SandboxRecord, reason: str) -> None:
        # A drain that pauses publishes every pause: its sandboxes are to resume elsewhere.
        if self.store is not None and (reason == "drain" or self.takeover.wanted(rec)):
            self._paused.add(rec.sandbox_id)
            self._kick.set()

    async def resuming(self, sandbox_id: str) -> None:
        self._paused.discard(sandbox_id)
        await self.takeover.resuming(sandbox_id)

    def changed(self) -> None:
        """The node's sandbox records changed (store.on_change)."""
        if self.store is not None:
            self._ended_check = True
            self._kick.set()

    def deleted(self, snapshot_id: str) -> None:
        self._pending.discard(snapshot_id)
        if self.store is not None:
            self._spawn(self._unpublish(snapshot_id))

    async def locate(self, name: str) -> str | None:
        # One fetch per name at a time: a group of creates from one snapshot fetches once.
        async with self._fetching.setdefault(name, asyncio.Lock()):
            return await self._locate(name)

    async def _locate(self, name: str) -> str | None:
        try:
            entries = [e for kv in (await self.etcd.get_prefix(catalog_prefix(self.prefix)))[0]
                       if (e := parse_entry(kv.value)) is not None]  # fmt: skip
            peers = await self._peers()
        except EtcdError as e:
            log.warning("looking for snapshot %s in the cluster: %s", name, e)
            return None
        entry = newest(entries, name)
        want = entry.snapshot_id if entry is not None else name
        if entry is not None and self._have(want):
            return want
        holders = [p for p in peers if want in p.snapshots or want in p.cached
                   or (entry is None and name in p.shared)]  # fmt: skip
        pub = None
        for peer in holders:
            pub = await describe(self.client, peer.url, want, self.cfg.cluster.token)
            if pub is not None:
                break
        if pub is None and entry is not None and self.store is not None:
            with contextlib.suppress(ObjectNotFound, ObjectStoreError):
                pub = await asyncio.to_thread(transfer.published, self.store, want)
        if pub is None:
            return None
        sid = pub.snapshot_id
        if self._have(sid):
            return sid
        sources = [(p.name, p.url) for p in peers if sid in p.snapshots or sid in p.cached]
        await self._fetch(pub, sources, from_store=entry is not None)
        return sid

    def _have(self, snapshot_id: str) -> bool:
        try:
            self.runtime.snapshot_info(snapshot_id)
        except TemplateNotFound:
            return False
        with contextlib.suppress(OSError):
            (self.snapshots.path(snapshot_id) / USED_FILE).touch()
        return True

    async def _peers(self) -> list[NodeRecord]:
        kvs, _ = await self.etcd.get_prefix(nodes_prefix(self.prefix))
        out = []
        for kv in kvs:
            with contextlib.suppress(ValueError):
                rec = NodeRecord.model_validate_json(kv.value)
                if rec.name != self.node:
                    out.append(rec)
        return out

    # -- fetch -------------------------------------------------------------------------------

    async def _fetch(self, pub: Published, peers: list[tuple[str, str]], *,
                     from_store: bool) -> None:  # fmt: skip
        """Into this node's repository, from `peers` (name, url) and then the store."""
        try:
            kernel, tools = compat.local_files(self.cfg, pub.compat, self.accel())
        except compat.Incompatible as e:
            raise compat.Incompatible(
                f"snapshot {pub.snapshot_id} cannot restore on node {self.node}: {e}") from None
        data = sum(sum(1 for c in f.chunks if c != sums.ZERO) for f in pub.files.values())
        self.orch._admit_space((data * pub.chunk_size) >> 20, "fetch a snapshot")
        t0 = time.perf_counter()
        with httpx.Client() as client:
            sources: list[transfer.ChunkSource] = [
                PeerChunks(name, url, pub.snapshot_id, self.cfg.cluster.token, client)
                for name, url in peers]  # fmt: skip
            if from_store and self.store is not None:
                sources.append(transfer.StoreChunks(self.store))
            moved = await asyncio.to_thread(self._adopt, pub, sources, kernel, tools)
        log.info("fetched snapshot %s: %d of %d MiB moved (%s) in %.1f s", pub.snapshot_id,
                 moved.moved_bytes >> 20, moved.logical_bytes >> 20,
                 ", ".join(f"{k} {v >> 20} MiB" for k, v in moved.by_source.items()) or "none",
                 time.perf_counter() - t0)  # fmt: skip
        await asyncio.to_thread(self.evict)

    def _adopt(self, pub: Published, sources: list[transfer.ChunkSource], kernel: Path,
               tools: Path) -> transfer.Moved:  # fmt: skip
        moved = transfer.Moved()

        def fill(stage: Path) -> Manifest:
            nonlocal moved
            moved = transfer.fetch(pub, stage, sources, local=self._local_chunks(pub))
            man = Manifest.from_json(dict(pub.manifest))
            man.kernel, man.tools = str(kernel), str(tools)
            man.fetched = {"at": time.time(), "from": sorted(moved.by_source),
                           "origin": pub.origin}  # fmt: skip
            (stage / USED_FILE).touch()
            return man

        record = sums.ChecksumRecord(
            snapshot_id=pub.snapshot_id, created_at=str(pub.manifest.get("created_at", "")),
            chunk_size=pub.chunk_size,
            files={n: sums.FileSums(size=f.size, chunks=f.chunks) for n, f in pub.files.items()})
        self.snapshots.adopt(pub.snapshot_id, fill, record)
        return moved

    def _local_chunks(self, pub: Published) -> dict[str, transfer.LocalChunk]:
        """The chunks of the template `pub` was made from, if this node has it."""
        try:
            sid = self.runtime.template(str(pub.manifest.get("template", ""))).build_id
            rec = sums.read_record(self.snapshots.path(sid) / CHECKSUMS_FILE)
        except (TemplateNotFound, sums.ChecksumRecordError, SnapshotNotFound):
            return {}
        return transfer.local_chunks({self.snapshots.path(sid): rec}) if rec else {}

    async def _sweeping(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            with contextlib.suppress(EtcdError):
                await self.sweep()

    async def sweep(self) -> list[str]:
        """Fetched copies of snapshots the cluster no longer has (deleted on their node:
        neither in the catalog nor any member's own), unless a restore uses them."""
        copies = self.cached()
        if not copies:
            return []
        kvs, _ = await self.etcd.get_prefix(catalog_prefix(self.prefix))
        known = {kv.key.rsplit("/", 1)[1] for kv in kvs}
        for p in await self._peers():
            known.update(p.snapshots)
        gone = [sid for sid in copies
                if sid not in known and not self.orch._snap_refs.in_use(sid)]  # fmt: skip
        for sid in gone:
            with contextlib.suppress(TemplateNotFound):
                await asyncio.to_thread(self.runtime.delete_snapshot, sid)
            log.info("fetched snapshot %s dropped: the cluster no longer has it", sid)
        return gone

    def evict(self) -> list[str]:
        """Fetched copies beyond `[store] cache_bytes`, least recently used first."""
        copies = {s.snapshot_id: self.snapshots.path(s.snapshot_id)
                  for s in self.runtime.list_snapshots() if s.fetched}  # fmt: skip
        used = {}
        for sid, d in copies.items():
            with contextlib.suppress(OSError):
                used[sid] = (d / USED_FILE).stat().st_mtime
        sizes = {sid: tree_usage(d).total for sid, d in copies.items()}
        pinned = {sid for sid in copies if self.orch._snap_refs.in_use(sid)}
        out = lru.evictions(copies, used, pinned, lambda keep: sum(sizes[k] for k in keep),
                            self.cfg.store.cache_bytes)  # fmt: skip
        for sid in out:
            with contextlib.suppress(TemplateNotFound):
                self.runtime.delete_snapshot(sid)
            log.info("fetched snapshot %s evicted from the cache", sid)
        return out

    # -- publish -----------------------------------------------------------------------------

    async def _publishing(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            failed = False
            for sid in sorted(self._paused):
                try:
                    await self.takeover.publish(sid)
                    self._paused.discard(sid)
                except (ObjectStoreError, EtcdError, OSError, transfer.TransferError) as e:
                    log.warning("publishing paused sandbox %s: %s (tried again)", sid, e)
                    failed = True
                except Exception as e:  # its paused state went meanwhile (resumed, killed)
                    log.info("paused sandbox %s not published: %s", sid, e)
                    self._paused.discard(sid)
            if self._ended_check:
                self._ended_check = False
                try:
                    await self.takeover.ended_ones()
                except EtcdError:
                    self._ended_check = failed = True
            for sid in sorted(self._pending):
                try:
                    await self.publish(sid)
                    self._pending.discard(sid)
                except (SnapshotNotFound, SnapshotCorrupt, TemplateNotFound):
                    self._pending.discard(sid)
                except (ObjectStoreError, EtcdError, OSError, transfer.TransferError) as e:
                    log.warning("publishing snapshot %s: %s (tried again)", sid, e)
                    failed = True
            if failed:
                self._spawn(self._kick_later())
            await asyncio.sleep(LOOP_PAUSE_S)  # a burst of changes is one round

    async def _kick_later(self) -> None:
        await asyncio.sleep(RETRY_S)
        self._kick.set()

    async def publish(self, snapshot_id: str) -> transfer.Moved:
        """Into the store, then into the catalog."""
        assert self.store is not None
        snap = self.runtime.snapshot_info(snapshot_id)  # TemplateNotFound: gone meanwhile
        if snap.fetched:
            raise TemplateNotFound(snapshot_id)  # its own node publishes it
        d = self.snapshots.path(snapshot_id)
        man = self.snapshots.get(snapshot_id)
        moved, pub = await asyncio.to_thread(self._publish_files, snapshot_id, man)
        entry = PublishedEntry(snapshot_id=snapshot_id, names=list(snap.names),
                               memory_mib=snap.shape.memory_mib, node=self.node,
                               created_at=snap.created_at, published_at=pub.published_at,
                               logical_bytes=pub.logical_bytes())  # fmt: skip
        await self.etcd.put(published_key(self.prefix, snapshot_id), entry.model_dump_json())
        if not d.exists():  # deleted while it was published: so is its publication
            await self._unpublish(snapshot_id)
            raise SnapshotNotFound(snapshot_id)
        (d / PUBLISHED_FILE).write_text(json.dumps(
            {"at": pub.published_at, "moved_bytes": moved.moved_bytes}))
        log.info("published snapshot %s: %d of %d MiB sent", snapshot_id,
                 moved.moved_bytes >> 20, moved.logical_bytes >> 20)  # fmt: skip
        return moved

    def describe(self, name: str) -> Published:
        """What this node holds as `name` (its own or a fetched copy, or a fork's snapshot
        while the fork lasts), for a peer."""
        if name.startswith(FORK_PREFIX):  # transient: no checksum record of its own
            man = self.snapshots.get(name)
            d = self.snapshots.path(name)
            record = sums.ChecksumRecord(
                snapshot_id=name, created_at=man.created_at,
                files={f: sums.file_sums(d / f) for f in man.files})  # fmt: skip
            return transfer.describe(d, record, compat=self._compat(man))
        snap = self.orch.find_snapshot(name, fetched=True)  # TemplateNotFound
        man = self.snapshots.get(snap.snapshot_id)
        return transfer.describe(self.snapshots.path(snap.snapshot_id),
                                 self._record(snap.snapshot_id), compat=self._compat(man),
                                 origin=self._origin(snap.snapshot_id))  # fmt: skip

    async def fork_elsewhere(self, snapshot_id: str, kids: list[SandboxRecord]
                             ) -> list[object]:  # fmt: skip
        return await self.forks.elsewhere(snapshot_id, kids)

    def _publish_files(self, snapshot_id: str, man: Manifest
                       ) -> tuple[transfer.Moved, Published]:  # fmt: skip
        assert self.store is not None
        d = self.snapshots.path(snapshot_id)
        record = self._record(snapshot_id)
        moved = transfer.publish(self.store, d, record, compat=self._compat(man),
                                 origin=self._origin(snapshot_id))  # fmt: skip
        return moved, transfer.published(self.store, snapshot_id)

    def _record(self, snapshot_id: str) -> sums.ChecksumRecord:
        """Its checksum record, computed now if the background worker has not yet."""
        self.snapshots.compute_checksums(snapshot_id)
        rec = sums.read_record(self.snapshots.path(snapshot_id) / CHECKSUMS_FILE)
        if rec is None:
            raise SnapshotCorrupt(f"{snapshot_id}: no checksums kept for it")
        return rec

    def _compat(self, man: Manifest) -> compat.Compat:
        return compat.snapshot_compat(self.cfg, Path(man.kernel), Path(man.tools), self.accel())

    def _origin(self, snapshot_id: str) -> dict[str, object]:
        info = self.orch.resolve_template(snapshot_id, fetched=True)
        return {"envd_version": info.envd_version, "env": dict(info.env), "user": info.user,
                "workdir": info.workdir}  # fmt: skip

    async def _unpublish(self, snapshot_id: str) -> None:
        assert self.store is not None
        with contextlib.suppress(EtcdError):
            await self.etcd.delete(published_key(self.prefix, snapshot_id))
        with contextlib.suppress(ObjectStoreError):
            await asyncio.to_thread(self.store.delete, manifest_key(snapshot_id))

    def _spawn(self, work: Any) -> None:
        t = asyncio.get_running_loop().create_task(work)
        self._background.add(t)
        t.add_done_callback(self._background.discard)


def shared_names(snaps: Iterable[SnapshotInfo]) -> list[str]:
    """The ids and names of the node's own snapshots: what peers may fetch from it."""
    return sorted({n for s in snaps for n in (s.snapshot_id, *s.names)})
