"""FIEMAP accounting (storage/extents.py) on a real XFS with reflink, loop-mounted for the
test: own and shared bytes of clones, and the distinct bytes a set of files occupies."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv.storage.extents import distinct_bytes, file_usage
from aenv.storage.files import clone

MIB = 1 << 20


@pytest.fixture
def xfs(tmp_path: Path) -> Iterator[Path]:
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    with open(image, "wb") as f:
        f.truncate(320 * MIB)
    subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], check=True)
    mnt.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_clones_share_until_written_and_distinct_bytes_count_each_block_once(
        xfs: Path) -> None:  # fmt: skip
    a, b, c = xfs / "a", xfs / "b", xfs / "c"
    a.write_bytes(os.urandom(4 * MIB))
    clone(a, b)
    with open(b, "r+b") as f:  # 64 KiB of b's own, in the middle
        f.seek(MIB)
        f.write(os.urandom(64 << 10))
        f.flush()
        os.fsync(f.fileno())  # the write is remapped (a's range unshared) at writeback
    c.write_bytes(os.urandom(MIB))
    ua, ub = file_usage(a), file_usage(b)
    assert ub.own == 64 << 10 and ub.shared == 4 * MIB - (64 << 10)
    assert ua.own == 64 << 10 and ua.total == 4 * MIB  # a's old range is its own now
    assert distinct_bytes([a]) == distinct_bytes([b]) == 4 * MIB
    assert distinct_bytes([a, b]) == 4 * MIB + (64 << 10)
    assert distinct_bytes([a, b, c]) == 5 * MIB + (64 << 10)
    assert distinct_bytes([]) == 0
