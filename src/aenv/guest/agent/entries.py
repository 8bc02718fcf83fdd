"""``EntryInfo`` for a path, Go ``FileMode`` strings, and ListDir's walk order."""

from __future__ import annotations

import grp
import os
import posixpath
import pwd
import stat as st
from collections.abc import Iterator

from protobuf.wkt import Timestamp

from ..gen.filesystem_pb import EntryInfo, FileType

METADATA_XATTR_PREFIX = "user.e2b."

# Go's FileMode type letters, in FileMode.String() order (bit 31 down to bit 19).
_TYPE_LETTERS = "dalTLDpSugct?"


def go_mode_string(mode: int) -> str:
    """``os.FileMode(x).String()`` for a Linux ``st_mode``: e.g. ``-rw-r--r--``, ``drwxr-xr-x``.

    Letters: d dir, L symlink, D device, p fifo, S socket, u setuid, g setgid, c char
    device (after D), t sticky.
    """
    flags = set()
    fmt = st.S_IFMT(mode)
    if fmt == st.S_IFDIR:
        flags.add("d")
    elif fmt == st.S_IFLNK:
        flags.add("L")
    elif fmt == st.S_IFIFO:
        flags.add("p")
    elif fmt == st.S_IFSOCK:
        flags.add("S")
    elif fmt == st.S_IFBLK:
        flags.add("D")
    elif fmt == st.S_IFCHR:
        flags.update(("D", "c"))
    if mode & st.S_ISUID:
        flags.add("u")
    if mode & st.S_ISGID:
        flags.add("g")
    if mode & st.S_ISVTX:
        flags.add("t")
    out = "".join(c for c in _TYPE_LETTERS if c in flags) or "-"
    rwx = "rwxrwxrwx"
    return out + "".join(rwx[i] if mode & (1 << (8 - i)) else "-" for i in range(9))


def _file_type(mode: int) -> FileType:
    if st.S_ISDIR(mode):
        return FileType.DIRECTORY
    if st.S_ISLNK(mode):
        return FileType.SYMLINK
    # envd reports every non-directory (regular, fifo, device, socket) as a file.
    return FileType.FILE


class _Names:
    """uid/gid → name, memoised for one listing."""

    __slots__ = ("groups", "users")

    def __init__(self) -> None:
        self.users: dict[int, str] = {}
        self.groups: dict[int, str] = {}

    def user(self, uid: int) -> str:
        name = self.users.get(uid)
        if name is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            self.users[uid] = name
        return name

    def group(self, gid: int) -> str:
        name = self.groups.get(gid)
        if name is None:
            try:
                name = grp.getgrgid(gid).gr_name
            except KeyError:
                name = str(gid)
            self.groups[gid] = name
        return name


def read_metadata(path: str | int) -> dict[str, str]:
    """``user.e2b.*`` xattrs of a file as metadata (unsupported or unreadable → empty)."""
    try:
        names = os.listxattr(path)
    except OSError:
        return {}
    out: dict[str, str] = {}
    for name in names:
        if name.startswith(METADATA_XATTR_PREFIX):
            try:
                value = os.getxattr(path, name)
                out[name[len(METADATA_XATTR_PREFIX) :]] = value.decode("utf-8")
            except (OSError, UnicodeDecodeError):
                continue
    return out


def entry_info(
    path: str, lst: os.stat_result | None = None, names: _Names | None = None
) -> EntryInfo:
    """EntryInfo for ``path`` (as given, not symlink-resolved). Raises OSError.

    For a symlink, ``type`` and ``mode`` describe the target (when it exists) and
    ``symlink_target`` is the resolved absolute target, as the envd whose version the
    agent reports answers. ``is_symlink`` (a later envd's) stays unset: the SDK would
    report such an entry as SYMLINK rather than as its target's type.
    """
    if lst is None:
        lst = os.lstat(path)
    names = names or _Names()
    mode = lst.st_mode
    ftype = _file_type(mode)
    perm = st.S_IMODE(mode) & 0o777
    symlink_target: str | None = None
    is_symlink = st.S_ISLNK(mode)
    if is_symlink:
        symlink_target = os.path.realpath(path)
        try:
            target = os.stat(path)
        except OSError:
            pass
        else:
            ftype = _file_type(target.st_mode)
            perm = st.S_IMODE(target.st_mode) & 0o777
    mtime_ns = lst.st_mtime_ns
    return EntryInfo(
        name=posixpath.basename(path) or path,
        type=ftype,
        path=path,
        size=lst.st_size,
        mode=perm,
        permissions=go_mode_string(mode),
        owner=names.user(lst.st_uid),
        group=names.group(lst.st_gid),
        modified_time=Timestamp(seconds=mtime_ns // 1_000_000_000, nanos=mtime_ns % 1_000_000_000),
        symlink_target=symlink_target,
        metadata=read_metadata(path) if not is_symlink and st.S_ISREG(mode) else None,
    )


def walk(root: str, depth: int) -> Iterator[EntryInfo]:
    """Entries under ``root`` down to ``depth`` levels, in Go ``filepath.WalkDir`` order:
    lexical by name, depth-first pre-order (a directory's children follow it). Paths are
    built on ``root`` as given; symlinked directories are listed, not entered."""
    names = _Names()

    def visit(directory: str, level: int) -> Iterator[EntryInfo]:
        try:
            with os.scandir(directory) as it:
                children = sorted(it, key=lambda e: os.fsencode(e.name))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return
        for child in children:
            path = directory.rstrip("/") + "/" + child.name
            try:
                info = entry_info(path, child.stat(follow_symlinks=False), names)
            except FileNotFoundError:
                continue  # removed while listing
            yield info
            if level < depth and child.is_dir(follow_symlinks=False):
                yield from visit(path, level + 1)

    yield from visit(root, 1)
