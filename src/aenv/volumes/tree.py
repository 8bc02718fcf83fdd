"""A volume's files seen from the host: the content API's operations, confined to the volume.

Sandboxes write volumes as root, so a volume may hold anything a guest can make: symlinks
to the host's /etc, device nodes, fifos. Every path is therefore resolved by the kernel with
openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) from the volume's directory (a symlink that
leads out fails with EXDEV), the last component is never followed where the operation acts
on it, and only regular files and directories are ever opened (O_NONBLOCK, type checked on
the open descriptor, so a fifo cannot hang a request nor a device node be read).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

_SYS_OPENAT2 = 437  # x86_64 and arm64 (asm-generic)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
MAX_DEPTH = 16
MAX_ENTRIES = 10_000
CHUNK = 1 << 20


class PathError(ValueError):
    status = 400


class PathNotFound(PathError):
    status = 404


class PathExists(PathError):
    status = 409


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]  # fmt: skip


_libc = ctypes.CDLL(None, use_errno=True)


def _openat2(dirfd: int, path: str, flags: int, mode: int = 0) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
    while True:
        fd = _libc.syscall(_SYS_OPENAT2, dirfd, path.encode(), ctypes.byref(how),
                           ctypes.sizeof(how))  # fmt: skip
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err not in (errno.EINTR, errno.EAGAIN):  # EAGAIN: a rename raced the lookup
            raise OSError(err, os.strerror(err), path)


def split(path: str) -> list[str]:
    """The components of a content path, relative to the volume's root; PathError for a
    path that leaves it or is not a path."""
    if not isinstance(path, str) or "\0" in path:
        raise PathError("path must be a string without NUL bytes")
    parts: list[str] = []
    for p in path.split("/"):
        if p in ("", "."):
            continue
        if p == "..":
            if not parts:
                raise PathError(f"path {path!r} escapes the volume")
            parts.pop()
        else:
            parts.append(p)
    return parts


@dataclass(frozen=True)
class Entry:
    name: str
    type: str  # directory | file | symlink | unknown
    path: str
    size: int
    mode: int
    uid: int
    gid: int
    atime: str
    mtime: str
    ctime: str
    target: str | None = None


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat().replace("+00:00", "Z")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "unknown"


@contextlib.contextmanager
def _errors(path: str) -> Iterator[None]:
    """OS errors as the content API's: 404 for what is not there, 400 for the rest."""
    try:
        yield
    except FileNotFoundError:
        raise PathNotFound(f"path {path!r} not found") from None
    except FileExistsError:
        raise PathExists(f"path {path!r} exists") from None
    except NotADirectoryError:
        raise PathNotFound(f"path {path!r} not found: a component is not a directory") from None
    except OSError as e:
        if e.errno == errno.EXDEV:
            raise PathError(f"path {path!r} leads out of the volume (through a symlink)"
                            ) from None  # fmt: skip
        if e.errno == errno.ELOOP:
            raise PathError(f"path {path!r} is a symlink") from None
        if e.errno == errno.ENOTEMPTY:
            raise PathExists(f"path {path!r} is a directory that is not empty") from None
        if e.errno == errno.ENOSPC:
            raise PathError(f"no space left for {path!r}") from None
        raise PathError(f"path {path!r}: {e.strerror}") from None


class Tree:
    """One volume's directory. Blocking calls: the API runs them in a thread."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @contextlib.contextmanager
    def _root(self) -> Iterator[int]:
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _parent(self, parts: list[str], make: bool = False) -> Iterator[int]:
        """The directory holding the last component (the root for the root's children);
        `make`: its missing ancestors are made (mkdir -p), owned as their parent."""
        with self._root() as root:
            fd = os.dup(root)
            try:
                for part in parts[:-1]:
                    if make:
                        with contextlib.suppress(FileExistsError):
                            _mkdir_like_parent(fd, part, 0o755, None, None)
                    nxt = _openat2(fd, part, os.O_RDONLY | os.O_DIRECTORY)
                    os.close(fd)
                    fd = nxt
                yield fd
            finally:
                os.close(fd)

    def _entry(self, dirfd: int, name: str, rel: list[str]) -> Entry:
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        target = os.readlink(name, dir_fd=dirfd) if stat.S_ISLNK(st.st_mode) else None
        return Entry(name=rel[-1] if rel else "", type=_kind(st.st_mode),
                     path="/" + "/".join(rel), size=st.st_size,
                     mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid,
                     atime=_iso(st.st_atime_ns), mtime=_iso(st.st_mtime_ns),
                     ctime=_iso(st.st_ctime_ns), target=target)  # fmt: skip

    def stat(self, path: str) -> Entry:
        parts = split(path)
        with _errors(path):
            if not parts:
                with self._root() as root:
                    return self._entry(root, ".", [])
            with self._parent(parts) as pfd:
                return self._entry(pfd, parts[-1], parts)

    def list(self, path: str, depth: int = 1) -> list[Entry]:
        """The entries under a directory, `depth` levels down (not the directory itself);
        symlinks are listed, never followed."""
        if not 1 <= depth <= MAX_DEPTH:
            raise PathError(f"depth must be 1 to {MAX_DEPTH}")
        parts = split(path)
        out: list[Entry] = []
        with _errors(path), self._root() as root:
            fd = _openat2(root, "/".join(parts) or ".", os.O_RDONLY | os.O_DIRECTORY)
            try:
                self._walk(fd, parts, depth, out)
            finally:
                os.close(fd)
        return out

    def _walk(self, fd: int, rel: list[str], depth: int, out: list[Entry]) -> None:
        for name in sorted(os.listdir(fd)):
            if len(out) >= MAX_ENTRIES:
                raise PathError(f"more than {MAX_ENTRIES} entries: list with a smaller depth")
            try:
                e = self._entry(fd, name, [*rel, name])
            except FileNotFoundError:
                continue  # removed meanwhile
            out.append(e)
            if depth > 1 and e.type == "directory":
                try:
                    sub = _openat2(fd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                try:
                    self._walk(sub, [*rel, name], depth - 1, out)
                finally:
                    os.close(sub)

    def make_dir(self, path: str, uid: int | None, gid: int | None, mode: int | None,
                 force: bool) -> Entry:  # fmt: skip
        """mkdir; `force`: parents too, and an existing directory is no error (mkdir -p)."""
        parts = split(path)
        if not parts:
            raise PathExists("the volume's root exists")
        with _errors(path), self._parent(parts, make=force) as pfd:
            try:
                _mkdir_like_parent(pfd, parts[-1], 0o755 if mode is None else mode, uid, gid)
            except FileExistsError:
                e = self._entry(pfd, parts[-1], parts)
                if not force or e.type != "directory":
                    raise
                return e
            return self._entry(pfd, parts[-1], parts)

    def open_read(self, path: str) -> tuple[int, int]:
        """(descriptor, size) of a regular file; symlinks inside the volume are followed."""
        parts = split(path)
        with _errors(path), self._root() as root:
            fd = _openat2(root, "/".join(parts) or ".", os.O_RDONLY | os.O_NONBLOCK)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                raise PathError(f"path {path!r} is not a regular file")
            os.set_blocking(fd, True)
            return fd, st.st_size

    def begin_write(self, path: str) -> tuple[int, int, str]:
        """A fresh file beside `path` (parents made), renamed over it by `commit_write`:
        readers see the old content or the whole new one, and a cut upload leaves nothing.
        Returns (parent descriptor, file descriptor, temporary name)."""
        parts = split(path)
        if not parts:
            raise PathError("the volume's root is a directory")
        with _errors(path):
            with self._parent(parts, make=True) as p:
                pfd = os.dup(p)
            tmp = f".{parts[-1][:200]}.aenv-{secrets.token_hex(4)}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o644, dir_fd=pfd)  # fmt: skip
            except BaseException:
                os.close(pfd)
                raise
            return pfd, fd, tmp

    def commit_write(self, path: str, pfd: int, fd: int, tmp: str, uid: int | None,
                     gid: int | None, mode: int | None) -> Entry:  # fmt: skip
        parts = split(path)
        try:
            with _errors(path):
                try:
                    old = os.stat(parts[-1], dir_fd=pfd, follow_symlinks=False)
                except FileNotFoundError:
                    old = None
                if old is not None and stat.S_ISDIR(old.st_mode):
                    raise PathError(f"path {path!r} is a directory")
                # An overwrite keeps the file's owner and mode; a new file takes its parent's.
                ref = old if old is not None and stat.S_ISREG(old.st_mode) else os.fstat(pfd)
                os.fchown(fd, ref.st_uid if uid is None else uid,
                          ref.st_gid if gid is None else gid)  # fmt: skip
                default_mode = stat.S_IMODE(ref.st_mode) if ref is old else 0o644
                os.fchmod(fd, default_mode if mode is None else mode)
                os.fsync(fd)
                os.replace(tmp, parts[-1], src_dir_fd=pfd, dst_dir_fd=pfd)
                return self._entry(pfd, parts[-1], parts)
        finally:
            self.abort_write(pfd, fd, tmp)

    @staticmethod
    def abort_write(pfd: int, fd: int, tmp: str) -> None:
        """Closes both; removes the temporary file unless it was renamed."""
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=pfd)
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(OSError):
            os.close(pfd)

    def remove(self, path: str) -> None:
        """A file, a symlink (not its target) or a whole directory."""
        parts = split(path)
        if not parts:
            raise PathError("the volume's root cannot be removed (delete the volume)")
        with _errors(path), self._parent(parts) as pfd:
            st = os.stat(parts[-1], dir_fd=pfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(parts[-1], dir_fd=pfd)  # fd-based: symlinks are not followed
            else:
                os.unlink(parts[-1], dir_fd=pfd)

    def set_metadata(self, path: str, uid: int | None, gid: int | None,
                     mode: int | None) -> Entry:  # fmt: skip
        parts = split(path)
        with _errors(path), self._root() as root:
            rel = "/".join(parts) or "."
            try:
                fd = _openat2(root, rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise PathError(f"path {path!r} is a symlink: its metadata is its "
                                    "target's") from None  # fmt: skip
                raise
            try:
                st = os.fstat(fd)
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                    raise PathError(f"path {path!r} is neither a file nor a directory")
                if uid is not None or gid is not None:
                    os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
                if mode is not None:
                    os.fchmod(fd, mode)
            finally:
                os.close(fd)
            if not parts:
                return self._entry(root, ".", [])
        return self.stat(path)


def _mkdir_like_parent(pfd: int, name: str, mode: int, uid: int | None,
                       gid: int | None) -> None:  # fmt: skip
    """mkdir owned as its parent unless told (the content API runs as root; a guest's user
    must still write what it made)."""
    os.mkdir(name, mode, dir_fd=pfd)
    parent = os.fstat(pfd)
    fd = _openat2(pfd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.fchown(fd, parent.st_uid if uid is None else uid,
                  parent.st_gid if gid is None else gid)  # fmt: skip
        os.fchmod(fd, mode)  # not the umask's
    finally:
        os.close(fd)
