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
  and every downloaded chunk is checked against its digest.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from aenv.storage.checksums import ZERO, ChecksumRecord
from aenv.store.objects import ObjectStore
from aenv.store.published import Compat, Published, PublishedFile, chunk_key, manifest_key


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


@dataclass(frozen=True)
class LocalChunk:
    path: Path
    offset: int
    length: int


def publish(store: ObjectStore, snapshot_dir: Path, record: ChecksumRecord, *,
            kind: str = "snapshot", compat: Compat | None = None,
            manifest: Mapping[str, object] | None = None) -> Moved:  # fmt: skip
    moved = Moved()
    size = record.chunk_size
    sent: set[str] = set()
    files: dict[str, PublishedFile] = {}
    for name, sums in record.files.items():
        files[name] = PublishedFile(size=sums.size, chunks=sums.chunks)
        moved.logical_bytes += sums.size
        with open(snapshot_dir / name, "rb") as f:
            fd = f.fileno()
            for i, digest in enumerate(sums.chunks):
                moved.chunks += 1
                if digest == ZERO:
                    moved.zero += 1
                    continue
                if digest in sent or store.has(chunk_key(digest)):
                    moved.present += 1
                    continue
                length = min(size, sums.size - i * size)
                data = os.pread(fd, length, i * size)
                if len(data) != length or hashlib.sha256(data).hexdigest() != digest:
                    raise TransferError(f"{name} chunk {i} is not what its checksum says: "
                                        "the file changed since it was recorded")  # fmt: skip
                store.put(chunk_key(digest), data)
                sent.add(digest)
                moved.moved += 1
                moved.moved_bytes += length
    if manifest is None:
        path = snapshot_dir / "manifest.json"
        manifest = json.loads(path.read_text()) if path.is_file() else {}
    pub = Published(snapshot_id=record.snapshot_id, kind=kind,  # type: ignore[arg-type]
                    chunk_size=size, files=files, manifest=dict(manifest),
                    compat=compat or Compat())  # fmt: skip
    store.put(manifest_key(record.snapshot_id), pub.model_dump_json().encode())
    return moved


def published(store: ObjectStore, snapshot_id: str) -> Published:
    return Published.model_validate_json(store.get(manifest_key(snapshot_id)))


def fetch(store: ObjectStore, pub: Published, dest: Path, *,
          local: Mapping[str, LocalChunk] | None = None) -> Moved:  # fmt: skip
    """Write `pub`'s files into `dest` (which must not hold them yet) and its manifest."""
    moved = Moved(logical_bytes=pub.logical_bytes())
    local = local or {}
    size = pub.chunk_size
    dest.mkdir(parents=True, exist_ok=True)
    for name, f in pub.files.items():
        fd = os.open(dest / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
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
                data = store.get(chunk_key(digest))
                if len(data) != length or hashlib.sha256(data).hexdigest() != digest:
                    raise TransferError(f"chunk {digest[:12]} from the store is corrupt")
                os.pwrite(fd, data, i * size)
                moved.moved += 1
                moved.moved_bytes += length
            os.fsync(fd)
        finally:
            os.close(fd)
    (dest / "manifest.json").write_text(json.dumps(pub.manifest))
    return moved


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
