"""A stopped VMM's guest RAM, seen from the host: how much of it the process holds, which
pages, and handing them back or bringing them in again (the hot pause tier).

Guest RAM is a shared mapping of the VM's `memory` file. Once a pause has saved and fsynced
it, its pages are clean: `process_madvise(MADV_PAGEOUT)` drops them from the QEMU process
(and from the page cache) without a write, and `MADV_WILLNEED` reads them back ahead of the
continue. Both act on another process's mapping through a pidfd, so QEMU needs no help.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
_SYS_PROCESS_MADVISE = 440  # x86_64 (and the generic table)
MADV_WILLNEED = 3
MADV_PAGEOUT = 21
_IOV_MAX = 1024  # UIO_MAXIOV: iovecs per call
_PRESENT = 1 << 63
_libc = ctypes.CDLL(None, use_errno=True)


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


@dataclass(frozen=True)
class RamMapping:
    """Where a VMM maps its RAM file: [start, end) in the process's address space."""

    pid: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


class MemoryOpError(OSError):
    pass


def ram_mapping(pid: int, memory_file: Path) -> RamMapping:
    """The mapping of `memory_file` in process `pid`, matched by device and inode (QEMU's
    path is the one inside its jail)."""
    st = os.stat(memory_file)
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    best: RamMapping | None = None
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 5:
                continue
            major, _, minor = parts[3].partition(":")
            if (int(major, 16), int(minor, 16), int(parts[4])) != want:
                continue
            lo, _, hi = parts[0].partition("-")
            m = RamMapping(pid, int(lo, 16), int(hi, 16))
            if best is None or m.size > best.size:
                best = m
    if best is None:
        raise MemoryOpError(f"process {pid} does not map {memory_file}")
    return best


def mapping_rss(m: RamMapping) -> int:
    """Bytes of the mapping resident in the process (smaps `Rss`)."""
    head = f"{m.start:x}-"
    with open(f"/proc/{m.pid}/smaps") as f:
        inside = False
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split(maxsplit=1)[0]:
                inside = line.startswith(head)
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1]) << 10
    return 0


def process_rss(pid: int) -> int:
    """The whole process's resident bytes (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    return 0


def resident_runs(m: RamMapping) -> list[tuple[int, int]]:
    """(offset, length) byte runs of the mapping that are resident, from the pagemap's
    present bits (8 bytes a page: 1 MiB to read for 512 MiB of RAM)."""
    pages = m.size // PAGE
    with open(f"/proc/{m.pid}/pagemap", "rb") as f:
        f.seek((m.start // PAGE) * 8)
        raw = f.read(pages * 8)
    entries = memoryview(raw).cast("Q")
    runs: list[tuple[int, int]] = []
    start = -1
    for i in range(len(entries)):
        present = entries[i] & _PRESENT
        if present and start < 0:
            start = i
        elif not present and start >= 0:
            runs.append((start * PAGE, (i - start) * PAGE))
            start = -1
    if start >= 0:
        runs.append((start * PAGE, (len(entries) - start) * PAGE))
    return runs


def _advise(m: RamMapping, runs: list[tuple[int, int]], advice: int) -> None:
    fd = os.pidfd_open(m.pid)
    try:
        for i in range(0, len(runs), _IOV_MAX):
            chunk = runs[i:i + _IOV_MAX]
            iov = (_Iovec * len(chunk))(*(_Iovec(m.start + off, n) for off, n in chunk))
            # The call may stop short (it returns the bytes it advised): the rest is only
            # advice, so a short count is not retried.
            r = _libc.syscall(_SYS_PROCESS_MADVISE, fd, iov, len(chunk), advice, 0)
            if r < 0:
                err = ctypes.get_errno()
                raise MemoryOpError(err, f"process_madvise({advice}): {os.strerror(err)}")
    finally:
        os.close(fd)


def page_out(m: RamMapping) -> None:
    """Drop the mapping's pages from the process (clean file pages: no write)."""
    _advise(m, [(0, m.size)], MADV_PAGEOUT)


def prefetch(m: RamMapping, runs: list[tuple[int, int]]) -> None:
    """Read these runs of the mapping back in ahead of use (readahead of the file)."""
    if runs:
        _advise(m, runs, MADV_WILLNEED)
