"""The data directory must live on a reflink filesystem (XFS reflink=1 or btrfs).

RAM and disk files are cloned, never copied (architecture.md §4). When the host filesystem
cannot reflink, set-up creates a sparse XFS image beside the data directory and loop-mounts
it there. Nothing host-wide changes: no fstab edit; the node re-mounts it at start.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

from aenv.storage.files import can_reflink

log = logging.getLogger(__name__)


class DataFsError(Exception):
    pass


def image_path(data_dir: Path) -> Path:
    return data_dir.with_name(data_dir.name + ".xfs.img")


def is_mountpoint(path: Path) -> bool:
    return os.path.ismount(path)


def ensure(data_dir: Path, size_gib: int = 64) -> None:
    """Make data_dir a reflink-capable directory, mounting an XFS image if needed."""
    data_dir.mkdir(parents=True, exist_ok=True)
    img = image_path(data_dir)
    if not is_mountpoint(data_dir) and img.exists():
        _mount(img, data_dir)
    if can_reflink(data_dir):
        return
    if is_mountpoint(data_dir):
        raise DataFsError(f"{data_dir} is a mount point without reflink support")
    if any(data_dir.iterdir()):
        raise DataFsError(
            f"{data_dir} cannot reflink and is not empty; move its contents away or point "
            "AENV_DATA_DIR at a directory on XFS (reflink=1) or btrfs"
        )
    log.info("creating %d GiB sparse XFS image %s for %s", size_gib, img, data_dir)
    tmp = img.with_name(img.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.truncate(size_gib << 30)
        _run(["mkfs.xfs", "-q", "-m", "reflink=1", str(tmp)])
        os.replace(tmp, img)
    finally:
        tmp.unlink(missing_ok=True)
    _mount(img, data_dir)
    if not can_reflink(data_dir):
        raise DataFsError(f"{data_dir} still cannot reflink after mounting {img}")


def _mount(img: Path, data_dir: Path) -> None:
    _run(["mount", "-o", "loop,noatime", str(img), str(data_dir)])


def _run(argv: list[str]) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise DataFsError(f"{' '.join(argv)} failed: {r.stderr.strip() or r.stdout.strip()}")
