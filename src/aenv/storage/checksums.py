"""Per-chunk SHA-256 checksums of snapshot files, computed off the hot path.

A snapshot's checksum record (`checksums.json` beside its files) lists, for each file, its
size and one digest per 4 MiB chunk of its logical content. RAM and disk files are mostly
sparse: a chunk that is entirely a hole is recorded as "zero" without being read
(SEEK_DATA/SEEK_HOLE), and a chunk whose bytes are all zero gets the same entry however it
is stored, so a record describes content, not allocation (a copy or re-sparsified file
still verifies).
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, StringConstraints, ValidationError, model_validator

from aenv.storage.files import write_json_atomic

CHUNK_SIZE = 4 << 20
ZERO = "zero"  # the entry of an all-zero chunk (a hole, or zeros written out)
FORMAT_VERSION = 1

_ZEROS = memoryview(bytes(CHUNK_SIZE))
_zero_digests: dict[int, str] = {}

Digest = Annotated[str, StringConstraints(pattern=r"^(zero|[0-9a-f]{64})$")]


class ChecksumRecordError(Exception):
    """A checksum record exists but is not a readable record of this format."""


class Interrupted(Exception):
    """The pacer's stop event was set (the node is shutting down): hashing stopped."""


@dataclass
class Pacer:
    """Bounds how fast a hashing loop reads (`rate` bytes/s; None: as fast as it can) and
    lets another thread stop it between chunks. One pacer per pass: idle time before it
    is not credit."""

    rate: float | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    bytes_read: int = 0
    _t0: float = field(default_factory=time.monotonic)

    def step(self, nbytes: int) -> None:
        self.bytes_read += nbytes
        if self.stop.is_set():
            raise Interrupted
        if self.rate is None or nbytes == 0:
            return
        ahead = self.bytes_read / self.rate - (time.monotonic() - self._t0)
        if ahead > 0 and self.stop.wait(ahead):
            raise Interrupted


class FileSums(BaseModel, frozen=True):
    size: int = Field(ge=0)
    chunks: tuple[Digest, ...]


class ChecksumRecord(BaseModel, frozen=True):
    """The on-disk record. A reader rejects another format version or algorithm."""

    format_version: Literal[1] = FORMAT_VERSION
    algorithm: Literal["sha256"] = "sha256"
    chunk_size: int = Field(CHUNK_SIZE, gt=0)
    snapshot_id: str
    created_at: str
    files: dict[str, FileSums]

    @model_validator(mode="after")
    def _chunk_counts(self) -> ChecksumRecord:
        for name, f in self.files.items():
            if len(f.chunks) != -(-f.size // self.chunk_size):
                raise ValueError(f"{name}: {len(f.chunks)} chunks for {f.size} bytes")
        return self


def sha256_file(path: Path) -> str:
    """The digest of a small file in one go (device state, ~100 KB: well under 1 ms)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _zero_digest(n: int) -> str:
    d = _zero_digests.get(n)
    if d is None:
        d = _zero_digests[n] = hashlib.sha256(_ZEROS[:n]).hexdigest()
    return d


def _segments(fd: int, start: int, end: int) -> list[tuple[int, int, bool]]:
    """(offset, length, is_data) pieces covering [start, end), from SEEK_DATA/SEEK_HOLE."""
    out: list[tuple[int, int, bool]] = []
    pos = start
    while pos < end:
        try:
            data = min(os.lseek(fd, pos, os.SEEK_DATA), end)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data at or after pos: the rest is a hole
                data = end
            elif e.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # no hole support: all data
                out.append((pos, end - pos, True))
                break
            else:
                raise
        if data > pos:
            out.append((pos, data - pos, False))
            pos = data
        if pos < end:
            hole = min(os.lseek(fd, pos, os.SEEK_HOLE), end)
            out.append((pos, hole - pos, True))
            pos = hole
    return out


def _chunk_digest(fd: int, start: int, length: int, buf: memoryview) -> tuple[str, int]:
    """(entry, bytes read) for one chunk; holes are hashed as zeros without reading."""
    segs = _segments(fd, start, start + length)
    if not any(is_data for _, _, is_data in segs):
        return ZERO, 0
    h = hashlib.sha256()
    read = 0
    for off, n, is_data in segs:
        if not is_data:
            h.update(_ZEROS[:n])
            continue
        view = buf[:n]
        got = 0
        while got < n:
            k = os.preadv(fd, [view[got:]], off + got)
            if k == 0:
                raise OSError(errno.EIO, f"file ended at {off + got}, inside its recorded size")
            got += k
        h.update(view)
        read += n
    digest = h.hexdigest()
    return (ZERO if digest == _zero_digest(length) else digest), read


def file_sums(path: Path, chunk_size: int = CHUNK_SIZE, pacer: Pacer | None = None) -> FileSums:
    """Hash `path` chunk by chunk. Pages read are dropped from the page cache afterwards:
    a background pass must not push out the cache running sandboxes use."""
    if chunk_size > CHUNK_SIZE:
        raise ValueError(f"chunk size {chunk_size} is above {CHUNK_SIZE}")
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        buf = memoryview(bytearray(min(chunk_size, size)))
        chunks = []
        for start in range(0, size, chunk_size):
            length = min(chunk_size, size - start)
            digest, read = _chunk_digest(fd, start, length, buf)
            chunks.append(digest)
            if read:
                os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)
            if pacer is not None:
                pacer.step(read)
    return FileSums(size=size, chunks=tuple(chunks))


def verify_file(path: Path, expected: FileSums, chunk_size: int,
                pacer: Pacer | None = None) -> list[str]:
    """What differs between `path` and its recorded sums (empty: it verifies)."""
    size = path.stat().st_size
    if size != expected.size:
        return [f"size {size} is not the recorded {expected.size}"]
    got = file_sums(path, chunk_size, pacer)
    return [f"chunk {i} (offset {i * chunk_size}) differs"
            for i, (a, b) in enumerate(zip(got.chunks, expected.chunks, strict=True)) if a != b]


def write_record(path: Path, record: ChecksumRecord) -> None:
    """Atomically (write, fsync, rename): a crash never leaves a partial record visible."""
    write_json_atomic(path, record.model_dump(mode="json"))


def read_record(path: Path) -> ChecksumRecord | None:
    """The record at `path`; None if there is none yet; ChecksumRecordError if unreadable."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return ChecksumRecord.model_validate_json(text)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise ChecksumRecordError(f"{path.name}: {where}: {first['msg']}") from None
