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
from aenv.cluster.links import verify_for
from aenv.cluster.membership import NodeRecord, others
from aenv.cluster.peers import PeerChunks, describe
from aenv.cluster.published import PublishedEntry, newest, parse_entry, published_key
from aenv.cluster.published import published_prefix as catalog_prefix
from aenv.cluster.takeover import Takeover, sealer_of
from aenv.machines.api import SnapshotInfo, TemplateInfo, TemplateNotFound
from aenv.machines.machine import FORK_PREFIX
from aenv.orchestrator import mounts
from aenv.orchestrator.errors import NotFound
from aenv.secrets.sealing import Sealer
from aenv.storage import checksums as sums
from aenv.storage import lru
from aenv.storage.extents import tree_usage
from aenv.storage.snapshots import CHECKSUMS_FILE, Manifest, SnapshotCorrupt, SnapshotNotFound
from aenv.storage.templates import Template, TemplateMissing
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
TEMPLATES_EVERY_S = 2.0  # new templates (builds) are looked for this often, to publish


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
        self._unpublishable: set[str] = set()
        self.takeover = Takeover(self)
        self.forks = Forks(self)
        self._paused: set[str] = set()  # paused sandboxes to publish
        self._republish: set[str] = set()  # ... again, if they are published (`updated`)
        self._ended_check = False  # records changed: entries of ended sandboxes may go
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sweep: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._fetching: dict[str, asyncio.Lock] = {}
        self._verify = verify_for(cfg.cluster)  # peers' TLS (links.py)
        self.client = httpx.AsyncClient(verify=self._verify)

    def accel(self) -> str | None:
        accel = getattr(self.runtime, "accel", None)
        return accel() if callable(accel) else None

    async def start(self) -> None:
        if self.store is not None:
            self._pending.update(s.snapshot_id for s in self.orch.snapshot_list()
                                 if not self._published(s.snapshot_id))  # fmt: skip
            self._pending.update(self._unpublished_templates())
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

    def sealer(self) -> Sealer:
        return sealer_of(self.orch.secrets_key)

    def cached(self) -> list[str]:
        """Copies fetched here, snapshots and templates (peers may fetch from them too)."""
        return sorted([*self._copies(), *(t.template_id for t in self._template_copies())])

    def _copies(self) -> list[str]:
        return sorted(s.snapshot_id for s in self.runtime.list_snapshots() if s.fetched)

    def _template_copies(self) -> list[TemplateInfo]:
        return [t for t in self.orch.templates(fetched=True) if t.fetched]

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

    def updated(self, rec: SandboxRecord) -> None:
        if self.store is not None:
            self._republish.add(rec.sandbox_id)
            self._kick.set()

    async def resuming(self, sandbox_id: str) -> None:
        self._paused.discard(sandbox_id)
        self._republish.discard(sandbox_id)
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
            entries = await self._catalog()
            peers = await self._peers()
        except EtcdError as e:
            log.warning("looking for snapshot %s in the cluster: %s", name, e)
            return None
        entry = newest(entries, name)
        want = entry.snapshot_id if entry is not None else name
        if entry is not None and self._have(want):
            return want
        # By name, a peer's own (or fetched) template too: `shared` holds template names.
        by_name = entry is None or entry.kind == "template"
        holders = [p for p in peers if want in p.snapshots or want in p.cached
                   or (by_name and (name in p.shared or name in p.cached))]  # fmt: skip
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
        if pub.kind == "template":
            return await self._take_template(pub, [(p.name, p.url) for p in holders],
                                             from_store=entry is not None)  # fmt: skip
        sid = pub.snapshot_id
        if self._have(sid):
            return sid
        sources = [(p.name, p.url) for p in peers if sid in p.snapshots or sid in p.cached]
        await self._fetch(pub, sources, from_store=entry is not None)
        return sid

    async def _take_template(self, pub: Published, peers: list[tuple[str, str]], *,
                             from_store: bool) -> str:  # fmt: skip
        """Another node's template, here as a fetched copy: its snapshot (the files every
        create clones), then its catalog entry. Its rootfs image is not fetched: a build
        from it runs where it was built (builds run on one node)."""
        t = Template.from_json(pub.origin)  # a template's Published carries its record
        with contextlib.suppress(TemplateMissing):
            self.runtime.catalog.get(t.name)
            return t.name  # here meanwhile
        if not self.runtime.has_snapshot(t.snapshot_id):
            await self._fetch(pub, peers, from_store=from_store)
        t.fetched = {"at": time.time(), "from": [n for n, _ in peers] or ["store"]}
        self.runtime.catalog.put(t)
        self.used(t.snapshot_id)
        log.info("template %s (%s) fetched", t.name, t.snapshot_id)
        return t.name

    def _have(self, snapshot_id: str) -> bool:
        try:
            self.runtime.snapshot_info(snapshot_id)
        except TemplateNotFound:
            return False
        self.used(snapshot_id)
        return True

    def used(self, snapshot_id: str) -> None:
        with contextlib.suppress(OSError):
            (self.snapshots.path(snapshot_id) / USED_FILE).touch()

    async def _peers(self) -> list[NodeRecord]:
        return await others(self.etcd, self.prefix, self.node)

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
        with httpx.Client(verify=self._verify) as client:
            sources: list[transfer.ChunkSource] = [
                PeerChunks(name, url, pub.snapshot_id, self.cfg.cluster.token, client)
                for name, url in peers]  # fmt: skip
            if from_store and self.store is not None:
                sources.append(transfer.StoreChunks(self.store))
            moved = await asyncio.to_thread(self._adopt, pub, sources, kernel, tools)
        mounts.remember(self.orch.store.db, pub.snapshot_id,
                        [tuple(m) for m in pub.origin.get("volume_mounts") or ()])
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
                           "origin": pub.origin, "instance": self.cfg.instance}  # fmt: skip
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
        """Fetched copies the cluster no longer has, unless a restore uses them: snapshots
        deleted on their node (neither in the catalog nor any member's own), templates no
        member holds any more or holds as another build."""
        copies, templates = self._copies(), self._template_copies()
        if not copies and not templates:
            return []
        kvs, _ = await self.etcd.get_prefix(catalog_prefix(self.prefix))
        known = {kv.key.rsplit("/", 1)[1] for kv in kvs}
        peers = await self._peers()
        for p in peers:
            known.update(p.snapshots)
        gone = [sid for sid in copies
                if sid not in known and not self.orch._snap_refs.in_use(sid)]  # fmt: skip
        for sid in gone:
            with contextlib.suppress(TemplateNotFound):
                await asyncio.to_thread(self.runtime.delete_snapshot, sid)
            log.info("fetched snapshot %s dropped: the cluster no longer has it", sid)
        for t in templates:
            if t.build_id in known or self.orch._snap_refs.in_use(t.build_id):
                continue  # published to the store: this very build stays fetchable
            builds = [pub.snapshot_id for p in peers if t.template_id in p.shared
                      if (pub := await describe(self.client, p.url, t.template_id,
                                                self.cfg.cluster.token)) is not None]  # fmt: skip
            if t.build_id not in builds and (builds or not any(
                    t.template_id in p.shared for p in peers)):  # fmt: skip
                self._drop_template(t, "the cluster no longer has this build")
                gone.append(t.template_id)
        return gone

    def _drop_template(self, t: TemplateInfo, why: str) -> None:
        with contextlib.suppress(TemplateNotFound, NotFound):
            self.orch.delete_snapshot(t.template_id)  # a copy: its publication stays
        log.info("fetched template %s (%s) dropped: %s", t.template_id, t.build_id, why)

    def evict(self) -> list[str]:
        """Fetched copies, snapshots and templates, beyond `[store] cache_bytes`, least
        recently used first."""
        templates = {t.build_id: t for t in self._template_copies()}
        copies = {sid: self.snapshots.path(sid) for sid in [*self._copies(), *templates]}
        used = {}
        for sid, d in copies.items():
            with contextlib.suppress(OSError):
                used[sid] = (d / USED_FILE).stat().st_mtime
        sizes = {sid: tree_usage(d).total for sid, d in copies.items()}
        pinned = {sid for sid in copies if self.orch._snap_refs.in_use(sid)}
        out = lru.evictions(copies, used, pinned, lambda keep: sum(sizes[k] for k in keep),
                            self.cfg.store.cache_bytes)  # fmt: skip
        for sid in out:
            if sid in templates:
                self._drop_template(templates[sid], "evicted from the cache")
                continue
            with contextlib.suppress(TemplateNotFound):
                self.runtime.delete_snapshot(sid)
            log.info("fetched snapshot %s evicted from the cache", sid)
        return out

    # -- publish -----------------------------------------------------------------------------

    async def _publishing(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), TEMPLATES_EVERY_S)
            self._kick.clear()
            self._pending.update(self._unpublished_templates())
            failed = False
            for sid in sorted(self._republish):
                try:
                    if await self.takeover.is_published(sid):
                        self._paused.add(sid)
                    self._republish.discard(sid)
                except EtcdError as e:
                    log.warning("is paused sandbox %s published: %s (tried again)", sid, e)
                    failed = True
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
                except (SnapshotNotFound, SnapshotCorrupt, TemplateNotFound) as e:
                    self._pending.discard(sid)
                    self._unpublishable.add(sid)  # a template's: not looked for again
                    log.info("snapshot %s not published: %s", sid, e)
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
        """A snapshot of this node, or the snapshot of one of its templates (by its build
        id): into the store, then into the catalog."""
        assert self.store is not None
        d = self.snapshots.path(snapshot_id)
        man = self.snapshots.get(snapshot_id)
        entry, origin = self._entry(snapshot_id)
        older = [] if entry.kind != "template" else [  # its earlier builds
            e.snapshot_id for e in await self._catalog()
            if e.kind == "template" and e.node == self.node and e.snapshot_id != snapshot_id
            and set(e.names) & set(entry.names)]  # fmt: skip
        moved, pub = await asyncio.to_thread(self._publish_files, snapshot_id, man,
                                             entry.kind, origin)  # fmt: skip
        entry.published_at, entry.logical_bytes = pub.published_at, pub.logical_bytes()
        await self.etcd.put(published_key(self.prefix, snapshot_id), entry.model_dump_json())
        for old in older:  # a template's earlier builds: its publication is its newest
            await self._unpublish(old)
        if not d.exists():  # deleted while it was published: so is its publication
            await self._unpublish(snapshot_id)
            raise SnapshotNotFound(snapshot_id)
        (d / PUBLISHED_FILE).write_text(json.dumps(
            {"at": pub.published_at, "moved_bytes": moved.moved_bytes,
             "store": self.cfg.store.url}))  # fmt: skip
        log.info("published %s %s: %d of %d MiB sent", entry.kind, snapshot_id,
                 moved.moved_bytes >> 20, moved.logical_bytes >> 20)  # fmt: skip
        return moved

    def _unpublished_templates(self) -> list[str]:
        """The build ids of this node's own templates not yet published (none unless
        `[store] publish_templates`; never the default template: every node has its own)."""
        if not self.cfg.store.publish_templates:
            return []
        return [t.snapshot_id for t in self.runtime.catalog.list()
                if t.fetched is None and t.name != self.cfg.default_template
                and self.snapshots.path(t.snapshot_id).is_dir()
                and t.snapshot_id not in self._unpublishable
                and not self._published(t.snapshot_id)]  # fmt: skip

    def _published(self, snapshot_id: str) -> bool:
        """Whether this node published `snapshot_id` to its store (the mark names the store:
        a template's snapshot may be in a repository several nodes share)."""
        try:
            mark = json.loads((self.snapshots.path(snapshot_id) / PUBLISHED_FILE).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(mark, dict) and mark.get("store", self.cfg.store.url) == (
            self.cfg.store.url)

    def _entry(self, snapshot_id: str) -> tuple[PublishedEntry, dict[str, object]]:
        """The catalog entry a publish of `snapshot_id` writes and the origin its
        `Published` carries. TemplateNotFound if it is not this node's own (gone meanwhile,
        or a fetched copy: its node publishes it)."""
        with contextlib.suppress(TemplateNotFound):
            snap = self.runtime.snapshot_info(snapshot_id)
            if snap.fetched:
                raise TemplateNotFound(snapshot_id)
            return PublishedEntry(snapshot_id=snapshot_id, names=list(snap.names),
                                  memory_mib=snap.shape.memory_mib, node=self.node,
                                  created_at=snap.created_at), self._origin(snapshot_id)
        t = next((t for t in self.runtime.catalog.list()
                  if t.snapshot_id == snapshot_id and t.fetched is None), None)  # fmt: skip
        if t is None:
            raise TemplateNotFound(snapshot_id)
        return PublishedEntry(snapshot_id=snapshot_id, names=[t.name, *t.aliases],
                              kind="template", memory_mib=t.shape.memory_mib, node=self.node,
                              created_at=t.created_at), self._carried(t)

    async def _catalog(self) -> list[PublishedEntry]:
        return [e for kv in (await self.etcd.get_prefix(catalog_prefix(self.prefix)))[0]
                if (e := parse_entry(kv.value)) is not None]  # fmt: skip

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
        with contextlib.suppress(TemplateNotFound, TemplateMissing):
            t = self.runtime.catalog.get(self.orch.template(name).template_id)
            man = self.snapshots.get(t.snapshot_id)
            return transfer.describe(self.snapshots.path(t.snapshot_id),
                                     self._record(t.snapshot_id), kind="template",
                                     compat=self._compat(man), origin=self._carried(t))
        snap = self.orch.find_snapshot(name, fetched=True)  # TemplateNotFound
        man = self.snapshots.get(snap.snapshot_id)
        return transfer.describe(self.snapshots.path(snap.snapshot_id),
                                 self._record(snap.snapshot_id), compat=self._compat(man),
                                 origin=self._origin(snap.snapshot_id))  # fmt: skip

    async def fork_elsewhere(self, snapshot_id: str, kids: list[SandboxRecord]
                             ) -> list[object]:  # fmt: skip
        return await self.forks.elsewhere(snapshot_id, kids)

    def _publish_files(self, snapshot_id: str, man: Manifest, kind: str,
                       origin: dict[str, object]) -> tuple[transfer.Moved, Published]:  # fmt: skip
        assert self.store is not None
        d = self.snapshots.path(snapshot_id)
        record = self._record(snapshot_id)
        moved = transfer.publish(self.store, d, record, kind=kind, compat=self._compat(man),
                                 origin=origin)  # fmt: skip
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

    @staticmethod
    def _carried(t: Template) -> dict[str, object]:
        """What a template's `Published` carries as its origin: its record, as its own node
        has it (a copy's `fetched` mark is the fetching node's to set). Its newest build
        only: earlier builds kept for their tags stay on the node that built them."""
        return {**t.to_json(), "fetched": None, "versions": []}

    def _origin(self, snapshot_id: str) -> dict[str, object]:
        info = self.orch.resolve_template(snapshot_id, fetched=True)
        # and the volumes its source mounted: its memory expects them at any node
        return {"envd_version": info.envd_version, "env": dict(info.env), "user": info.user,
                "workdir": info.workdir,
                "volume_mounts": mounts.of_snapshot(self.orch.store.db, snapshot_id)}

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


def shared_names(snaps: Iterable[SnapshotInfo], templates: Iterable[TemplateInfo] = ()
                 ) -> list[str]:  # fmt: skip
    """The ids and names of the node's own snapshots and templates: what peers may fetch
    from it."""
    return sorted({n for s in snaps for n in (s.snapshot_id, *s.names)}
                  | {n for t in templates for n in (t.template_id, *t.aliases)})
