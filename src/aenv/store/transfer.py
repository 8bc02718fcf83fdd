"""Publishing a snapshot to an object store and fetching it back, chunk by chunk.

Both sides work from the snapshot's chunk checksums (`storage/checksums.py`: SHA-256 per
4 MiB chunk of each file, all-zero chunks marked `zero` without being read):

- publish sends each chunk the store does not hold yet, once; zero chunks never, and a
  chunk of a template already published is already there (content addressing). The
  chunk's bytes are hashed again as they are read: a file that changed since its record
  fails the publish rather than store a wrong chunk. The manifest goes last.
- fetch makes each file sparse at its size and writes only its non-zero chunks. A chunk the
  node already has locally (`local`: digest -> where, from the checksum records of the
  templates and snapshots it holds) is copied from there; only the rest is downloaded,
  from the first of its `sources` that has it (a peer node holding the snapshot, then the
  object store), and every downloaded chunk is checked against its digest: a source that
  sends a wrong one is not asked again.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from aenv.storage.checksums import ZERO, ChecksumRecord
from aenv.store.objects import ObjectNotFound, ObjectStore, ObjectStoreError
from aenv.store.published import (
    Compat,
    Published,
    PublishedFile,
    chunk_key,
    manifest_key,
    paused_key,
)

DOWNLOADS = 4  # chunks sent or downloaded at once


class TransferError(Exception):
    pass


@dataclass
class Moved:
    """What a publish or a fetch moved, against the snapshot's logical size."""

    logical_bytes: int = 0
    chunks: int = 0
    zero: int = 0  # chunks that were holes or zeros: never moved
    present: int = 0  # already in the store (publish) or copied from local files (fetch)
    moved: int = 0  # sent (publish) or downloaded (fetch)
    moved_bytes: int = 0
    by_source: dict[str, int] = field(default_factory=dict)  # fetch: bytes from each source


class ChunkSource(Protocol):
    """Where a fetch downloads chunks from."""

    name: str  # "store", "peer:<node>"

    def chunk(self, file: str, offset: int, length: int, digest: str) -> bytes | None:
        """The chunk at `offset` of the snapshot's `file`, whose digest is `digest`; None if
        this source lacks it. Raises SourceFailed if the source is out of reach."""


class SourceFailed(Exception):
    pass


class StoreChunks:
    """The object store as a chunk source (chunks by digest)."""

    name = "store"

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def chunk(self, file: str, offset: int, length: int, digest: str) -> bytes | None:
        try:
            return self.store.get(chunk_key(digest))
        except ObjectNotFound:
            return None
        except ObjectStoreError as e:
            raise SourceFailed(str(e)) from None


@dataclass(frozen=True)
class LocalChunk:
    path: Path
    offset: int
    length: int


def describe(snapshot_dir: Path, record: ChecksumRecord, *, kind: str = "snapshot",
             compat: Compat | None = None, manifest: Mapping[str, object] | None = None,
             origin: Mapping[str, object] | None = None,
             sandbox: Mapping[str, object] | None = None) -> Published:  # fmt: skip
    """The `Published` of a snapshot on disk, from its checksum record."""
    if manifest is None:
        path = snapshot_dir / "manifest.json"
        manifest = json.loads(path.read_text()) if path.is_file() else {}
    files = {name: PublishedFile(size=sums.size, chunks=sums.chunks)
             for name, sums in record.files.items()}  # fmt: skip
    return Published(snapshot_id=record.snapshot_id, kind=kind,  # type: ignore[arg-type]
                     chunk_size=record.chunk_size, files=files, manifest=dict(manifest),
                     compat=compat or Compat(), origin=dict(origin or {}),
                     sandbox=dict(sandbox or {}))  # fmt: skip


def publish(store: ObjectStore, snapshot_dir: Path, record: ChecksumRecord, *,
            kind: str = "snapshot", compat: Compat | None = None,
            manifest: Mapping[str, object] | None = None,
            origin: Mapping[str, object] | None = None,
            sandbox: Mapping[str, object] | None = None) -> Moved:  # fmt: skip
    """Send what the store lacks of the snapshot, then its `Published` (a paused sandbox's,
    `kind` "paused", under `paused_key`)."""
    pub = describe(snapshot_dir, record, kind=kind, compat=compat, manifest=manifest,
                   origin=origin, sandbox=sandbox)  # fmt: skip
    moved = Moved()
    size = record.chunk_size
    claimed: set[str] = set()  # digests one worker sends (once, however many files hold them)
    lock = threading.Lock()

    def send(fd: int, name: str, i: int, length: int, digest: str) -> None:
        if store.has(chunk_key(digest)):
            with lock:
                moved.present += 1
            return
        data = os.pread(fd, length, i * size)
        if len(data) != length or hashlib.sha256(data).hexdigest() != digest:
            raise TransferError(f"{name} chunk {i} is not what its checksum says: "
                                "the file changed since it was recorded")  # fmt: skip
        store.put(chunk_key(digest), data)
        with lock:
            moved.moved += 1
            moved.moved_bytes += length

    with ThreadPoolExecutor(DOWNLOADS, thread_name_prefix="aenv-publish") as pool:
        for name, sums in record.files.items():
            moved.logical_bytes += sums.size
            pending: list[Future[None]] = []
            with open(snapshot_dir / name, "rb") as f:
                try:
                    for i, digest in enumerate(sums.chunks):
                        moved.chunks += 1
                        if digest == ZERO:
                            moved.zero += 1
                            continue
                        if digest in claimed:
                            moved.present += 1
                            continue
                        claimed.add(digest)
                        length = min(size, sums.size - i * size)
                        pending.append(pool.submit(send, f.fileno(), name, i, length, digest))
                    for fut in pending:
                        fut.result()  # the first failure fails the publish
                finally:
                    for fut in pending:
                        fut.cancel()
                    wait(pending)
    key = paused_key(record.snapshot_id) if kind == "paused" else manifest_key(record.snapshot_id)
    store.put(key, pub.model_dump_json().encode())
    return moved


def published(store: ObjectStore, snapshot_id: str, *, paused: bool = False) -> Published:
    key = paused_key(snapshot_id) if paused else manifest_key(snapshot_id)
    return Published.model_validate_json(store.get(key))


def fetch(pub: Published, dest: Path, sources: Sequence[ChunkSource], *,
          local: Mapping[str, LocalChunk] | None = None) -> Moved:  # fmt: skip
    """Write `pub`'s files into `dest` (which must not hold them yet) and its manifest.
    Downloads run `DOWNLOADS` at a time (each source is a network round trip per chunk)."""
    moved = Moved(logical_bytes=pub.logical_bytes())
    good = list(sources)
    local = local or {}
    size = pub.chunk_size
    lock = threading.Lock()
    dest.mkdir(parents=True, exist_ok=True)

    def download(fd: int, name: str, i: int, length: int, digest: str) -> None:
        src, data = _download(good, name, i * size, length, digest, lock)
        os.pwrite(fd, data, i * size)  # distinct offsets: no lock needed
        with lock:
            moved.moved += 1
            moved.moved_bytes += length
            moved.by_source[src] = moved.by_source.get(src, 0) + length

    with ThreadPoolExecutor(DOWNLOADS, thread_name_prefix="aenv-fetch") as pool:
        for name, f in pub.files.items():
            fd = os.open(dest / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            pending: list[Future[None]] = []
            try:
                os.ftruncate(fd, f.size)  # sparse: the zero chunks stay holes
                for i, digest in enumerate(f.chunks):
                    moved.chunks += 1
                    if digest == ZERO:
                        moved.zero += 1
                        continue
                    length = min(size, f.size - i * size)
                    here = local.get(digest)
                    if here is not None and here.length == length:
                        data = _read(here)
                        if hashlib.sha256(data).hexdigest() == digest:
                            os.pwrite(fd, data, i * size)
                            moved.present += 1
                            continue
                    pending.append(pool.submit(download, fd, name, i, length, digest))
                for fut in pending:
                    fut.result()  # the first failure fails the fetch
                os.fsync(fd)
            finally:
                for fut in pending:
                    fut.cancel()
                wait(pending)
                os.close(fd)
    (dest / "manifest.json").write_text(json.dumps(pub.manifest))
    return moved


def _download(sources: list[ChunkSource], file: str, offset: int, length: int,
              digest: str, lock: threading.Lock) -> tuple[str, bytes]:  # fmt: skip
    """From the first source that has the chunk right; sources that fail or send a wrong
    chunk are dropped from `sources` for the rest of the fetch."""
    why: list[str] = []
    with lock:
        tried = list(sources)
    for src in tried:
        try:
            data = src.chunk(file, offset, length, digest)
        except SourceFailed as e:
            why.append(f"{src.name}: {e}")
            _drop(sources, src, lock)
            continue
        if data is None:
            why.append(f"{src.name}: does not have it")
            continue
        if len(data) == length and hashlib.sha256(data).hexdigest() == digest:
            return src.name, data
        why.append(f"{src.name}: sent a corrupt chunk")
        _drop(sources, src, lock)
    raise TransferError(f"chunk {digest[:12]} of {file} could not be fetched ("
                        + ("; ".join(why) or "no source") + ")")


def _drop(sources: list[ChunkSource], src: ChunkSource, lock: threading.Lock) -> None:
    with lock:
        if src in sources:
            sources.remove(src)


def local_chunks(records: Mapping[Path, ChecksumRecord]) -> dict[str, LocalChunk]:
    """Where each chunk digest of the given snapshots (directory -> record) is on disk."""
    out: dict[str, LocalChunk] = {}
    for directory, rec in records.items():
        for name, sums in rec.files.items():
            for i, digest in enumerate(sums.chunks):
                if digest != ZERO and digest not in out:
                    length = min(rec.chunk_size, sums.size - i * rec.chunk_size)
                    out[digest] = LocalChunk(directory / name, i * rec.chunk_size, length)
    return out


def _read(c: LocalChunk) -> bytes:
    with open(c.path, "rb") as f:
        return os.pread(f.fileno(), c.length, c.offset)
