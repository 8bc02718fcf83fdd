"""Paused sandboxes that may resume on another node (docs/cluster.md, "Across nodes").

- **Publish.** A sandbox whose pause is to be published (`[store] publish_paused`, or its
  own `aenv.publish` metadata) has its paused files, chunk by chunk, and its record sent to
  the store once it has paused (under its lock: it cannot resume meanwhile), then its
  entry `<prefix>paused/<id>` written (cluster/published.py).
- **Resume here.** Before a paused sandbox resumes on the node that holds it, its entry is
  deleted: the state it names is about to change, so no other node may resume it.
- **Take over.** A gateway that finds a paused sandbox's node lost or draining moves its
  binding to another node and asks that node to resume it, saying so (`wire.ADOPT_HEADER`, with
  the cluster token). That node fetches the paused state from the store into a directory of
  its own, takes the record over, and resumes it as its own. The node it left frees its
  copy when it reconciles its bindings (cluster/bindings.py).
- **End.** A sandbox that ends takes its entry with it, if the entry is still this node's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aenv.cluster.etcd import EtcdError, compare_mod, delete_op
from aenv.cluster.published import PublishedEntry, parse_entry, paused_key, paused_prefix
from aenv.machines.machine import PAUSE_MARKER
from aenv.network.egress import EgressPolicy
from aenv.orchestrator.errors import NotFound, Unavailable
from aenv.orchestrator.routes import Ingress
from aenv.orchestrator.states import SandboxState
from aenv.orchestrator.store import SEALED_COLUMNS, SandboxRecord
from aenv.secrets.sealing import Sealer, is_sealed
from aenv.storage import checksums as sums
from aenv.storage.files import write_json_atomic
from aenv.storage.snapshots import Manifest
from aenv.store import compat, transfer
from aenv.store.objects import ObjectNotFound, ObjectStoreError
from aenv.store.published import paused_key as store_paused_key

if TYPE_CHECKING:
    from aenv.cluster.sharing import Sharing

log = logging.getLogger("aenv.cluster")

PUBLISH_METADATA = "aenv.publish"  # "true" / "false": this sandbox's pauses are published


def sealer_of(secrets_key: bytes) -> Sealer:
    """What seals the records that leave a node: the cluster's key (the node's
    `secrets_key` once it has joined), which every node holds."""
    return Sealer.of_key(secrets_key)


def record_json(rec: SandboxRecord, sealer: Sealer) -> dict[str, Any]:
    """A record as it leaves the node (etcd, the object store, a peer), what grants access
    sealed under the cluster's key."""
    d = dataclasses.asdict(rec)
    d["state"] = str(rec.state)
    d["egress"] = rec.egress.to_json()
    d["ingress"] = rec.ingress.to_json()
    for c in SEALED_COLUMNS:
        if d[c] is not None:
            d[c] = sealer.seal(json.dumps(d[c]), f"{rec.sandbox_id}/{c}")
    return d


def record_of(d: dict[str, Any], sealer: Sealer) -> SandboxRecord:
    d = dict(d)
    for c in SEALED_COLUMNS:  # one published before sealing holds them as they are
        if isinstance(d.get(c), str) and is_sealed(d[c]):
            d[c] = json.loads(sealer.open(d[c], f"{d['sandbox_id']}/{c}"))
    d["state"] = SandboxState(d["state"])
    d["egress"] = EgressPolicy.from_json(d.get("egress") or {})
    d["ingress"] = Ingress.from_json(d.get("ingress") or {})
    fields = {f.name for f in dataclasses.fields(SandboxRecord)}
    return SandboxRecord(**{k: v for k, v in d.items() if k in fields})


class Takeover:
    def __init__(self, sharing: Sharing) -> None:
        self.s = sharing

    def wanted(self, rec: SandboxRecord) -> bool:
        own = rec.metadata.get(PUBLISH_METADATA)
        if own is not None:
            return own.lower() == "true"
        return self.s.cfg.store.publish_paused

    # -- publish ----------------------------------------------------------------------------

    async def publish(self, sandbox_id: str) -> transfer.Moved | None:
        """The paused state, under the sandbox's lock; None if it is no longer paused."""
        s = self.s
        assert s.store is not None
        async with s.orch._locks.hold(sandbox_id):
            rec = s.orch.store.get(sandbox_id)
            if rec is None or rec.state is not SandboxState.PAUSED:
                return None
            workdir = s.cfg.sandboxes_dir / sandbox_id
            moved, entry = await asyncio.to_thread(self._publish_files, rec, workdir)
            await s.etcd.put(paused_key(s.prefix, sandbox_id), entry.model_dump_json())
        log.info("published paused sandbox %s: %d of %d MiB sent", sandbox_id,
                 moved.moved_bytes >> 20, moved.logical_bytes >> 20)  # fmt: skip
        return moved

    def _publish_files(self, rec: SandboxRecord, workdir: Path
                       ) -> tuple[transfer.Moved, PublishedEntry]:  # fmt: skip
        s = self.s
        assert s.store is not None
        man = s.runtime.paused_manifest(rec.sandbox_id)
        man.memory = s.runtime.paused_with_memory(rec.sandbox_id)
        files = {name: sums.file_sums(workdir / name) for name in man.files}
        record = sums.ChecksumRecord(snapshot_id=rec.sandbox_id, created_at=man.created_at,
                                     files=files)  # fmt: skip
        moved = transfer.publish(s.store, workdir, record, kind="paused",
                                 compat=s._compat(man), manifest=man.to_json(),
                                 sandbox=record_json(rec, s.sealer()))  # fmt: skip
        entry = PublishedEntry(snapshot_id=rec.sandbox_id, kind="paused",
                               memory_mib=rec.memory_mib, node=s.node,
                               created_at=man.created_at, published_at=time.time(),
                               logical_bytes=moved.logical_bytes)  # fmt: skip
        return moved, entry

    async def is_published(self, sandbox_id: str) -> bool:
        return await self.s.etcd.get(paused_key(self.s.prefix, sandbox_id)) is not None

    # -- resume here, end -------------------------------------------------------------------

    async def resuming(self, sandbox_id: str) -> None:
        """Its paused state is about to change: no other node may resume it any more.
        Unavailable (503, retryable) if etcd cannot say so."""
        s = self.s
        try:
            if await s.etcd.delete(paused_key(s.prefix, sandbox_id)) and s.store is not None:
                s._spawn(self._forget_files(sandbox_id))
        except EtcdError as e:
            raise Unavailable(f"cannot resume {sandbox_id}: the cluster is out of reach "
                              f"({e})") from None

    async def ended_ones(self) -> None:
        """Entries of this node's published paused sandboxes that ended (or left)."""
        s = self.s
        kvs, _ = await s.etcd.get_prefix(paused_prefix(s.prefix))
        for kv in kvs:
            entry = parse_entry(kv.value)
            if entry is None or entry.node != s.node:
                continue
            rec = s.orch.store.get(entry.snapshot_id)
            if rec is None:
                await s.etcd.txn([compare_mod(kv.key, "EQUAL", kv.mod_revision)],
                                 [delete_op(kv.key)])
                if s.store is not None:
                    await self._forget_files(entry.snapshot_id)

    async def _forget_files(self, sandbox_id: str) -> None:
        assert self.s.store is not None
        with contextlib.suppress(ObjectStoreError):
            await asyncio.to_thread(self.s.store.delete, store_paused_key(sandbox_id))

    # -- take over --------------------------------------------------------------------------

    async def adopt(self, sandbox_id: str) -> None:
        """Make the paused sandbox a gateway moved here this node's own: its state from the
        store, its record as it was. NotFound (404) if it has no published paused state."""
        s = self.s
        if s.store is None:
            raise NotFound(f"sandbox {sandbox_id} has no published paused state here")
        async with s.orch._locks.hold(sandbox_id):
            if s.orch.store.get(sandbox_id) is not None:
                return  # a retried resume: adopted already
            try:
                if await s.etcd.get(paused_key(s.prefix, sandbox_id)) is None:
                    raise ObjectNotFound(sandbox_id)
                pub = await asyncio.to_thread(transfer.published, s.store, sandbox_id,
                                              paused=True)  # fmt: skip
            except (ObjectNotFound, ObjectStoreError, EtcdError) as e:
                raise NotFound(f"sandbox {sandbox_id} has no published paused state: "
                               f"{e}") from None
            try:
                kernel, tools = compat.local_files(s.cfg, pub.compat, s.accel())
            except compat.Incompatible as e:
                raise compat.Incompatible(f"sandbox {sandbox_id} cannot resume on node "
                                          f"{s.node}: {e}") from None
            t0 = time.perf_counter()
            rec = dataclasses.replace(record_of(pub.sandbox, s.sealer()), state=SandboxState.PAUSED,
                                      slot_addr=None, vmm_pid=None,
                                      updated_at_us=s.orch.now_us())  # fmt: skip
            moved = await asyncio.to_thread(self._place_files, pub, kernel, tools)
            try:
                s.orch.store.insert(rec, taken_over=True)
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, s.cfg.sandboxes_dir / sandbox_id, True)
                raise
        log.info("took over paused sandbox %s: %d of %d MiB moved (%s) in %.1f s", sandbox_id,
                 moved.moved_bytes >> 20, moved.logical_bytes >> 20,
                 ", ".join(f"{k} {v >> 20} MiB" for k, v in moved.by_source.items()) or "none",
                 time.perf_counter() - t0)  # fmt: skip

    def _place_files(self, pub: transfer.Published, kernel: Path, tools: Path
                     ) -> transfer.Moved:  # fmt: skip
        s = self.s
        assert s.store is not None
        final = s.cfg.sandboxes_dir / pub.snapshot_id
        stage = s.cfg.sandboxes_dir / f".adopt-{pub.snapshot_id}"
        shutil.rmtree(stage, ignore_errors=True)
        try:
            moved = transfer.fetch(pub, stage, [transfer.StoreChunks(s.store)],
                                   local=s._local_chunks(pub))  # fmt: skip
            man = Manifest.from_json(dict(pub.manifest))
            man.kernel, man.tools = str(kernel), str(tools)
            write_json_atomic(stage / PAUSE_MARKER, {"memory": man.memory})
            write_json_atomic(stage / "manifest.json", man.to_json())
            if final.exists():  # what a failed take-over left: never a live sandbox's
                shutil.rmtree(final)
            os.replace(stage, final)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        return moved
