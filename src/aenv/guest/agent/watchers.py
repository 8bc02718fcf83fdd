"""Directory watchers on inotify, with fsnotify's event semantics (what envd reports).

Event types: IN_CREATE/IN_MOVED_TO → CREATE, IN_MODIFY → WRITE, IN_ATTRIB → CHMOD,
IN_DELETE → REMOVE, IN_MOVED_FROM → RENAME. Names are relative to the watched directory.
``drain_all()`` moves everything the kernel has queued into the watchers' own queues; the
agent calls it before answering any request that changed files and before
GetWatcherEvents, so the events of a completed request are always visible to the next one.
"""

from __future__ import annotations

import os
import uuid
from collections import deque
from collections.abc import Callable

from ..gen.filesystem_pb import EntryInfo, EventType, FilesystemEvent
from .entries import entry_info
from .inotify import (
    IN_ATTRIB,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_ONLYDIR,
    WATCH_MASK,
    Inotify,
    RawEvent,
)

# Events kept per watcher between polls; older ones are dropped (bounded memory).
MAX_QUEUED_EVENTS = 16384

# Rejected unless allow_network_mounts (the SDK: "NFS, CIFS, SMB, FUSE").
NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "ceph", "glusterfs", "9p"}
    | {"lustre", "fuse", "fuseblk"}
)


def is_network_fs(fstype: str | None) -> bool:
    """True for network and FUSE filesystem types."""
    return fstype is not None and (fstype in NETWORK_FILESYSTEMS or fstype.startswith("fuse."))


_ENTRY_TYPES = (EventType.CREATE, EventType.WRITE, EventType.CHMOD)


def _event_type(mask: int) -> EventType | None:
    if mask & (IN_CREATE | IN_MOVED_TO):
        return EventType.CREATE
    if mask & IN_MODIFY:
        return EventType.WRITE
    if mask & IN_ATTRIB:
        return EventType.CHMOD
    if mask & IN_DELETE:
        return EventType.REMOVE
    if mask & IN_MOVED_FROM:
        return EventType.RENAME
    return None


def mount_fstype(path: str) -> str | None:
    """Filesystem type of the mount that holds ``path`` (from /proc/self/mountinfo)."""
    best, best_type = "", None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                sep = fields.index("-")
                mnt = fields[4].replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(
                    best
                ):
                    best, best_type = mnt, fields[sep + 1]
    except (OSError, ValueError, IndexError):
        return None
    return best_type


class Watcher:
    """An inotify watch on one directory (and its subtree if recursive).

    Valid until ``close()``; ``ended`` becomes True when the watched directory itself is
    removed or moved away.
    """

    def __init__(
        self,
        root: str,
        *,
        recursive: bool,
        include_entry: bool,
        on_events: Callable[[], None] | None = None,
    ) -> None:
        self.id = str(uuid.uuid4())
        self.root = root.rstrip("/") or "/"
        self.recursive = recursive
        self.include_entry = include_entry
        self.on_events = on_events
        self.ended = False
        self.events: deque[FilesystemEvent] = deque(maxlen=MAX_QUEUED_EVENTS)
        self._ino = Inotify()
        self._dirs: dict[int, str] = {}
        try:
            self._root_wd = self._add_dir("")
            if recursive:
                self._add_subtree("")
        except BaseException:
            self._ino.close()
            raise

    @property
    def fd(self) -> int:
        return self._ino.fd

    def _abs(self, rel: str) -> str:
        if not rel:
            return self.root
        return self.root + rel if self.root == "/" else self.root + "/" + rel

    def _add_dir(self, rel: str) -> int:
        wd = self._ino.add_watch(self._abs(rel), WATCH_MASK | IN_ONLYDIR)
        self._dirs[wd] = rel
        return wd

    def _add_subtree(self, rel: str) -> None:
        for dirpath, dirnames, _files in os.walk(self._abs(rel)):
            base = os.path.relpath(dirpath, self.root)
            for d in dirnames:
                sub = d if base == "." else base + "/" + d
                try:
                    self._add_dir(sub)
                except OSError:
                    continue

    def _drop_subtree(self, rel: str) -> None:
        prefix = rel + "/"
        for wd, d in list(self._dirs.items()):
            if d == rel or d.startswith(prefix):
                self._ino.rm_watch(wd)
                del self._dirs[wd]

    def pump(self) -> None:
        """Move the kernel's queued events into ``events``; notify if any arrived."""
        if self._ino.fd < 0:
            return
        before = len(self.events)
        added = False
        for raw in self._ino.read():
            added = self._handle(raw) or added
        if (added or len(self.events) != before) and self.on_events is not None:
            self.on_events()

    def _handle(self, raw: RawEvent) -> bool:
        mask = raw.mask
        if mask & IN_IGNORED:
            self._dirs.pop(raw.wd, None)
            if raw.wd == self._root_wd:
                self.ended = True
                return True
            return False
        rel_dir = self._dirs.get(raw.wd)
        if rel_dir is None:
            return False
        if not raw.name:
            # IN_DELETE_SELF / IN_MOVE_SELF of a watched directory: its parent reports
            # the entry change; only the root's own disappearance matters.
            if raw.wd == self._root_wd and mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                self.ended = True
                return True
            return False
        name = raw.name if not rel_dir else rel_dir + "/" + raw.name
        etype = _event_type(mask)
        if etype is not None:
            self._emit(name, etype)
        if self.recursive and mask & IN_ISDIR:
            if mask & (IN_CREATE | IN_MOVED_TO):
                self._watch_new_dir(name)
            elif mask & (IN_MOVED_FROM | IN_DELETE):
                self._drop_subtree(name)
        return etype is not None

    def _emit(self, name: str, etype: EventType) -> None:
        entry: EntryInfo | None = None
        if self.include_entry and etype in _ENTRY_TYPES:
            try:
                entry = entry_info(self._abs(name))
            except OSError:
                entry = None
        self.events.append(FilesystemEvent(name=name, type=etype, entry=entry))

    def _watch_new_dir(self, rel: str) -> None:
        """Watch a directory that appeared in a recursive watch, and report what was
        created in it before the watch existed (CREATE, plus WRITE for non-empty files):
        an upload creates parents and the file in one go, faster than events arrive."""
        try:
            self._add_dir(rel)
        except OSError:
            return
        for dirpath, dirnames, filenames in os.walk(self._abs(rel)):
            base = os.path.relpath(dirpath, self.root)
            for d in sorted(dirnames):
                sub = base + "/" + d
                try:
                    self._add_dir(sub)
                except OSError:
                    continue
                self._emit(sub, EventType.CREATE)
            for f in sorted(filenames):
                sub = base + "/" + f
                self._emit(sub, EventType.CREATE)
                try:
                    if os.lstat(self._abs(sub)).st_size > 0:
                        self._emit(sub, EventType.WRITE)
                except OSError:
                    continue

    def take(self) -> list[FilesystemEvent]:
        """Every queued event since the last take, oldest first."""
        self.pump()
        out = list(self.events)
        self.events.clear()
        return out

    def close(self) -> None:
        self._ino.close()
        self._dirs.clear()


class WatcherRegistry:
    """All live watchers: polled ones by id, streamed ones anonymously."""

    def __init__(self, add_reader: Callable[..., None], remove_reader: Callable[[int], object]):
        self._add_reader = add_reader
        self._remove_reader = remove_reader
        self._live: set[Watcher] = set()
        self.polled: dict[str, Watcher] = {}

    def open(
        self,
        root: str,
        *,
        recursive: bool,
        include_entry: bool,
        polled: bool,
        on_events: Callable[[], None] | None = None,
    ) -> Watcher:
        w = Watcher(root, recursive=recursive, include_entry=include_entry, on_events=on_events)
        self._live.add(w)
        self._add_reader(w.fd, w.pump)
        if polled:
            self.polled[w.id] = w
        return w

    def close(self, w: Watcher) -> None:
        if w in self._live:
            self._live.discard(w)
            self.polled.pop(w.id, None)
            self._remove_reader(w.fd)
            w.close()

    def drain_all(self) -> None:
        """Queue every event the kernel holds for any watcher (cheap: one read each)."""
        for w in self._live:
            w.pump()

    def close_all(self) -> None:
        for w in list(self._live):
            self.close(w)
