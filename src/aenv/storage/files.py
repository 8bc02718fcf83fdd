"""File primitives every plane shares: reflink clones, durable writes, ownership."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

FICLONE = 0x40049409  # _IOW(0x94, 9, int)
_warned_copy = False


class NoReflink(OSError):
    pass


def clone(src: Path, dst: Path, *, allow_copy: bool = True) -> None:
    """Make dst a reflink clone of src (O(extents), shares data). dst may already exist and
    be open elsewhere (a pooled QEMU's RAM file): its content is replaced in place.

    Without reflink support it falls back to a full copy, loudly, unless allow_copy is off.
    """
    global _warned_copy
    with open(src, "rb") as s, open(dst, "r+b" if dst.exists() else "wb") as d:
        try:
            fcntl.ioctl(d.fileno(), FICLONE, s.fileno())
            return
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY):
                raise
            if not allow_copy:
                raise NoReflink(e.errno, f"reflink {src} -> {dst}: {e.strerror}") from e
        if not _warned_copy:
            log.warning("filesystem cannot reflink: copying %s (slow, uses space)", src)
            _warned_copy = True
        d.truncate(0)
        shutil.copyfileobj(s, d, 1 << 20)


def can_reflink(directory: Path) -> bool:
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".reflink-probe-") as tmp:
        a, b = Path(tmp, "a"), Path(tmp, "b")
        a.write_bytes(b"x" * 4096)
        try:
            clone(a, b, allow_copy=False)
        except NoReflink:
            return False
        return True


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: object, mode: int = 0o644) -> None:
    """write, fsync, rename, fsync dir: a reader sees the old file or the whole new one.
    The temporary name is unique, so writers in several processes (nodes sharing a data
    directory) never clobber each other's half-written file. It is created exclusively and
    never through a symlink (O_EXCL | O_NOFOLLOW): VM directories belong to jail uids, and
    a planted symlink must not make root write wherever it points."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(8).hex()}.tmp")
    body = json.dumps(data, indent=2, sort_keys=True).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a planted symlink itself, not its target
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def remove_tree(path: Path) -> None:
    """Remove a directory, or a symlink to one together with its target."""
    if path.is_symlink():
        target = path.resolve()
        path.unlink()
        shutil.rmtree(target, ignore_errors=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)
