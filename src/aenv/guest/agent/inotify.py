"""A tiny inotify binding (ctypes over libc; the stdlib has none)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

IN_ACCESS = 0x00000001
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000

IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# fsnotify's default watch mask (what envd gets).
WATCH_MASK = (
    IN_CREATE
    | IN_MODIFY
    | IN_ATTRIB
    | IN_DELETE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)

_HEADER = struct.Struct("iIII")
_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.inotify_init1.argtypes = [ctypes.c_int]
        lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        _libc = lib
    return _libc


def _check(ret: int) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


@dataclass(frozen=True, slots=True)
class RawEvent:
    """One ``struct inotify_event``."""

    wd: int
    mask: int
    cookie: int
    name: str


class Inotify:
    """A non-blocking inotify instance. Close it when done."""

    def __init__(self) -> None:
        self.fd = _check(_lib().inotify_init1(IN_NONBLOCK | IN_CLOEXEC))

    def add_watch(self, path: str, mask: int) -> int:
        return _check(_lib().inotify_add_watch(self.fd, os.fsencode(path), mask))

    def rm_watch(self, wd: int) -> None:
        with contextlib.suppress(OSError):  # already gone (IN_IGNORED raced us)
            _check(_lib().inotify_rm_watch(self.fd, wd))

    def read(self) -> Iterator[RawEvent]:
        """Every event queued right now (none if the queue is empty)."""
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            if not buf:
                return
            yield from parse_events(buf)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def parse_events(buf: bytes) -> Iterator[RawEvent]:
    """Decode a buffer of packed ``inotify_event`` records."""
    offset = 0
    size = _HEADER.size
    while offset + size <= len(buf):
        wd, mask, cookie, length = _HEADER.unpack_from(buf, offset)
        offset += size
        raw = buf[offset : offset + length].split(b"\0", 1)[0]
        offset += length
        yield RawEvent(wd, mask, cookie, os.fsdecode(raw))
