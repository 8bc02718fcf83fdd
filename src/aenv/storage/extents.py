"""How much of a file's data is its own and how much it shares with other files (reflink
clones, deduplicated ranges): the FIEMAP ioctl's extent flags. Holes count as neither."""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

_FS_IOC_FIEMAP = 0xC020660B
_HEAD = struct.Struct("=QQLLLL")  # fm_start, fm_length, flags, mapped, count, reserved
_EXTENT = struct.Struct("=QQQQQLLLL")  # logical, physical, length, 2 reserved, flags, 3 reserved
_LAST, _SHARED = 0x1, 0x2000
_BATCH = 256


@dataclass(frozen=True)
class Usage:
    own: int = 0
    shared: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.own + other.own, self.shared + other.shared)

    @property
    def total(self) -> int:
        return self.own + self.shared


@dataclass(frozen=True)
class Extent:
    logical: int
    physical: int
    length: int
    shared: bool


def extents(path: Path) -> Iterator[Extent]:
    """The file's data extents, in order (OSError where FIEMAP is not supported)."""
    start = 0
    with open(path, "rb") as f:
        end = os.fstat(f.fileno()).st_size
        while start < end:
            buf = bytearray(_HEAD.size + _EXTENT.size * _BATCH)
            _HEAD.pack_into(buf, 0, start, end - start, 0x1, 0, _BATCH, 0)  # FIEMAP_FLAG_SYNC
            fcntl.ioctl(f.fileno(), _FS_IOC_FIEMAP, buf)
            mapped = _HEAD.unpack_from(buf)[3]
            if mapped == 0:
                return
            for i in range(mapped):
                logical, physical, length, _, _, flags, *_ = _EXTENT.unpack_from(
                    buf, _HEAD.size + i * _EXTENT.size)
                yield Extent(logical, physical, length, bool(flags & _SHARED))
                start = logical + length
                if flags & _LAST:
                    return


def file_usage(path: Path) -> Usage:
    """Own and shared data bytes of one file (OSError where FIEMAP is not supported)."""
    own = shared = 0
    for e in extents(path):
        if e.shared:
            shared += e.length
        else:
            own += e.length
    return Usage(own, shared)


def distinct_bytes(paths: Iterable[Path]) -> int:
    """The bytes of storage the files' data occupies, each block once however many of the
    files (or ranges of one) share it: what deleting all of them could free at most."""
    ranges = sorted((e.physical, e.physical + e.length) for p in paths for e in extents(p))
    total, reach = 0, 0
    for lo, hi in ranges:
        if hi > reach:
            total += hi - max(lo, reach)
            reach = hi
    return total


def tree_usage(root: Path) -> Usage:
    """The sum over the regular files under `root` (missing or unsupported files count 0)."""
    total = Usage()
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            if p.is_file() and not p.is_symlink():
                try:
                    total += file_usage(p)
                except OSError:
                    continue
    return total
