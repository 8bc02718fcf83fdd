"""Guest RAM as a private mapping of a shared, immutable file (architecture.md, "Guest
memory").

QEMU runs with `memory-backend-file,share=on` (so migration skips RAM: a save writes device
state only) and `aenv-ram.so` preloaded (`ramshim.c`), which maps that one file private:

- every VM restored from a snapshot maps the snapshot's own `memory` file (a hard link, one
  inode), so the host's page cache holds its pages once for all of them;
- what a guest writes becomes the VMM's anonymous memory (copy on write);
- at a save the node itself writes those pages (`written_runs`, read through
  /proc/<pid>/mem) into a new file: a reflink clone of the mapped file plus them
  (`write_back`); the VM's `memory` name moves to it;
- a VMM that lives on is then "rebased" (`remap`): the snapshot's file it was restored from
  (`memory.base`) is mapped over all of guest RAM and the new file over the runs the guest
  wrote (`memory.runs`): its written pages stop being anonymous memory, which nothing could
  reclaim on a host without swap, and become clean page cache of a file, while the pages it
  never wrote stay shared.

Every RAM file the node writes is root-owned and read-only (0444): it is never changed in
place, so it can be hard-linked into a snapshot and mapped by any VM.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from aenv.storage.files import clone, fsync_path
from aenv.vmm.base import VmmError
from aenv.vmm.memory import RamMapping

PAGE = os.sysconf("SC_PAGE_SIZE")
REBASE_SIGNAL = signal.SIGRTMIN + 4
REBASE_TIMEOUT_S = 5.0
SHIM_NAME = "aenv-ram.so"
CTL_NAME = "ram.ctl"
BASE_NAME = "memory.base"  # the snapshot's RAM file a VM was restored from (a hard link)
RUNS_NAME = "memory.runs"  # where `memory` differs from it: "offset length" lines
MAX_RUNS = 16384  # one mapping each (vm.max_map_count is 65530 a process)
_COPY_CHUNK = 16 << 20
# pagemap: bit 63 present, 62 swapped, 61 file page or shared anonymous. Byte 7 of each
# little-endian entry holds them: a written (anonymous) page is present and not a file page.
_WRITTEN = bytes(0x31 if (b & 0xA0) == 0x80 else 0x30 for b in range(256))
_RUN = re.compile(rb"1+")


class RamError(VmmError):
    pass


# A VMM's guest RAM: [start, end) in its address space (one type with the hot tier's).
Mapping = RamMapping


# -- the preloaded library --------------------------------------------------------------
def shim(artifacts_dir: Path) -> Path:
    """The built library, made once per source (artifacts/ramshim/<hash>/aenv-ram.so)."""
    src = resources.files("aenv.vmm").joinpath("ramshim.c").read_bytes()
    out = artifacts_dir / "ramshim" / hashlib.sha256(src).hexdigest()[:16] / SHIM_NAME
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    c = out.parent / "ramshim.c"
    c.write_bytes(src)
    r = subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-Wall", "-o", str(tmp), str(c),
                        "-ldl"], capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise RamError(f"building {SHIM_NAME} failed (is gcc installed?): {r.stderr[-800:]}")
    tmp.chmod(0o555)
    os.replace(tmp, out)
    return out


def shim_env(memory_file: Path, workdir: Path, lib: Path) -> dict[str, str]:
    return {"LD_PRELOAD": str(lib), "AENV_RAM_FILE": str(memory_file),
            "AENV_RAM_CTL": str(workdir / CTL_NAME)}


# -- the mapping -------------------------------------------------------------------------
def _scan(pid: int, memory_file: Path) -> tuple[int, int, bool]:
    """[lo, hi) over the VMAs of the VM's RAM files (`memory`, and `BASE_NAME` beside it:
    a rebase maps both), and whether any maps a `memory` that a rename has replaced
    (" (deleted)" until the next full rebase)."""
    names = {str(memory_file), str(memory_file.with_name(BASE_NAME))}
    lo = hi = -1
    stale = False
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6:
                continue
            path = parts[5].rstrip("\n")
            name = path.removesuffix(" (deleted)")
            if name not in names:
                continue
            stale = stale or name != path
            a, _, b = parts[0].partition("-")
            start, end = int(a, 16), int(b, 16)
            lo = start if lo < 0 else min(lo, start)
            hi = max(hi, end)
    return lo, hi, stale


def mapping(pid: int, memory_file: Path, size: int | None = None) -> Mapping:
    """The VMM's guest-RAM region: the VMAs of its RAM files, contiguous (`_scan`)."""
    lo, hi, _ = _scan(pid, memory_file)
    if lo < 0 or (size is not None and hi - lo != size):
        raise RamError(f"process {pid} does not map {memory_file} whole")
    return Mapping(pid, lo, hi)


def written_runs(m: Mapping) -> list[tuple[int, int]]:
    """(offset, length) byte runs of guest RAM the guest has written since the mapping's
    file was mapped: its anonymous pages (pagemap: 8 bytes a page)."""
    with open(f"/proc/{m.pid}/pagemap", "rb") as f:
        f.seek((m.start // PAGE) * 8)
        raw = f.read((m.size // PAGE) * 8)
    flags = raw[7::8].translate(_WRITTEN)
    return [(x.start() * PAGE, (x.end() - x.start()) * PAGE) for x in _RUN.finditer(flags)]


def _copy_runs(m: Mapping, dst: int, runs: list[tuple[int, int]], durable: bool = True
               ) -> int:
    """Copy the runs from the (stopped) VMM's guest RAM into the file `dst` at the same
    offsets, durable unless told not (`durable_later`). Returns the bytes copied."""
    copied = 0
    mem = os.open(f"/proc/{m.pid}/mem", os.O_RDONLY)
    try:
        for off, length in runs:
            done = 0
            while done < length:
                n = min(_COPY_CHUNK, length - done)
                data = os.pread(mem, n, m.start + off + done)
                if len(data) != n:
                    raise RamError(f"short read of guest RAM at {off + done:#x}")
                os.pwrite(dst, data, off + done)
                done += n
            copied += length
    finally:
        os.close(mem)
    if durable:
        os.fsync(dst)
    return copied


def write_back(m: Mapping, base: Path, out: Path,
               runs: list[tuple[int, int]] | None = None, durable: bool = True) -> int:
    """Write `out`: a clone of `base` (the file whose content the mapping shows where the
    guest did not write) with the guest's written pages over it, read-only, and durable
    unless told not. The VMM must be stopped. Returns the bytes copied."""
    runs = written_runs(m) if runs is None else runs
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        clone(base, tmp)
        dst = os.open(tmp, os.O_WRONLY)
        try:
            copied = _copy_runs(m, dst, runs, durable)
        finally:
            os.close(dst)
        os.chown(tmp, 0, 0)
        tmp.chmod(0o444)
        os.replace(tmp, out)
        if durable:
            fsync_path(out.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return copied


def rebase(pid: int, workdir: Path, base: Path | None, overlay: Path | None = None,
           runs: list[tuple[int, int]] | None = None, timeout_s: float = REBASE_TIMEOUT_S
           ) -> None:
    """Have the (stopped) VMM map `base` over its guest RAM (None: leave it), then
    `overlay` over `runs` (`ramshim.c`)."""
    ctl = workdir / CTL_NAME
    ack = workdir / f"{CTL_NAME}.ack"
    ack.unlink(missing_ok=True)
    lines = [str(base or ""), str(overlay or "")]
    lines += [f"{off} {n}" for off, n in (runs or []) if overlay]
    ctl.write_text("\n".join(lines) + "\n")
    ctl.chmod(0o644)
    try:
        os.kill(pid, REBASE_SIGNAL)
        deadline = time.monotonic() + timeout_s
        while not ack.exists():
            if time.monotonic() > deadline:
                raise RamError(f"VMM {pid} did not rebase its RAM in {timeout_s:.0f} s")
            time.sleep(0.0005)
        answer = ack.read_text().strip()
    except ProcessLookupError as e:
        raise RamError(f"VMM {pid} is gone") from e
    finally:
        ack.unlink(missing_ok=True)
        ctl.unlink(missing_ok=True)
    if answer != "ok":
        raise RamError(f"VMM {pid} could not rebase its RAM onto {base.name}: {answer}")


# -- a VM's RAM files: memory, and the base it was restored from --------------------------
@dataclass(frozen=True)
class Saved:
    written: int  # bytes of guest RAM written into the file
    runs: list[tuple[int, int]]  # where
    # Written into the inode the VMM maps already (nothing else links it): a rebase need
    # map only `runs`.
    in_place: bool


def save(pid: int, memory_file: Path, size: int, durable: bool = True) -> Saved:
    """Make `memory_file` the (stopped) VMM's guest RAM. Its written pages go into the file
    in place when no other name links it (no snapshot or VM maps that inode) and the VMM
    maps no older one: the pages it maps from the file elsewhere are unchanged. Else into
    a new file (`write_back`). When the VM has a base (`BASE_NAME`), the runs where
    `memory` differs from it (`RUNS_NAME`) are written first: a superset is safe, a subset
    never exists. Not `durable`: nothing is fsynced; `durable_later` does it."""
    lo, hi, stale = _scan(pid, memory_file)
    if lo < 0 or hi - lo != size:
        raise RamError(f"process {pid} does not map {memory_file} whole")
    m = Mapping(pid, lo, hi)
    runs = written_runs(m)
    if memory_file.with_name(BASE_NAME).exists():
        write_runs(memory_file, merge_runs([*read_runs(memory_file), *runs]), durable)
    if os.stat(memory_file).st_nlink == 1 and not stale:
        dst = os.open(memory_file, os.O_WRONLY)
        try:
            # Root's and read-only from here on, as a file written anew is: a snapshot may
            # link it (a cold-booted VM's RAM file was its jail's).
            _immutable(dst)
            return Saved(_copy_runs(m, dst, runs, durable), runs, True)
        finally:
            os.close(dst)
    return Saved(write_back(m, memory_file, memory_file, runs, durable), runs, False)


def durable_later(memory_file: Path) -> None:
    """What a save that was not durable left in the page cache, on disk: the RAM file, its
    runs, and the directory (a save into a new file renamed it there)."""
    fsync_path(memory_file)
    if (runs := memory_file.with_name(RUNS_NAME)).exists():
        fsync_path(runs)
    fsync_path(memory_file.parent)


def remap(pid: int, memory_file: Path, saved: Saved | None = None) -> None:
    """Rebase the VMM onto its RAM files: the base (shared with every VM of its snapshot)
    with `memory` over the runs the guest wrote, or `memory` whole when there is no base or
    the runs are too many for one mapping each. After a save in place only the runs it
    wrote change: `memory` is mapped over them, the rest stays as it is."""
    base = memory_file.with_name(BASE_NAME)
    runs = read_runs(memory_file) if base.exists() else []
    if len(runs) > MAX_RUNS:
        rebase(pid, memory_file.parent, memory_file)
    elif saved is not None and saved.in_place:
        rebase(pid, memory_file.parent, None, memory_file, saved.runs)
    elif base.exists():
        rebase(pid, memory_file.parent, base, memory_file, runs)
    else:
        rebase(pid, memory_file.parent, memory_file)


def save_and_remap(pid: int, memory_file: Path, size: int) -> Saved:
    """The guest's written pages into its RAM file, then the VMM rebased onto it (blocking;
    the VM is stopped)."""
    saved = save(pid, memory_file, size)
    remap(pid, memory_file, saved)
    return saved


def merge_runs(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for off, n in sorted(runs):
        if out and off <= out[-1][0] + out[-1][1]:
            last_off, last_n = out[-1]
            out[-1] = (last_off, max(last_n, off + n - last_off))
        else:
            out.append((off, n))
    return out


def read_runs(memory_file: Path) -> list[tuple[int, int]]:
    try:
        text = memory_file.with_name(RUNS_NAME).read_text()
    except FileNotFoundError:
        return []
    return [(int(a), int(b)) for a, b in (line.split() for line in text.splitlines() if line)]


def write_runs(memory_file: Path, runs: list[tuple[int, int]], durable: bool = True) -> None:
    path = memory_file.with_name(RUNS_NAME)
    tmp = path.with_name(f".{RUNS_NAME}.tmp")
    with open(tmp, "w") as f:
        f.write("".join(f"{off} {n}\n" for off, n in runs))
        f.flush()
        if durable:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def forget_base(memory_file: Path) -> None:
    """The VM's `memory` stands alone from now on (a fresh boot, a disk-only pause)."""
    for name in (BASE_NAME, RUNS_NAME):
        memory_file.with_name(name).unlink(missing_ok=True)


def readable(memory_file: Path) -> None:
    """A VM's RAM files readable by any jail and root's: they are immutable and shared by
    every VM of their snapshot (a jail that owned one could make it writable). One a node
    fetched or took over may have come as 0600; one saved in place by a node of 2026-12-04
    kept its cold-booted VM's jail owner."""
    for p in (memory_file, memory_file.with_name(BASE_NAME)):
        if p.exists():
            _immutable(p)


def _immutable(p: Path | int) -> None:
    st = os.stat(p)
    if (st.st_uid != 0 or st.st_gid != 0) and os.geteuid() == 0:
        os.chown(p, 0, 0)
    if st.st_mode & 0o777 != 0o444:
        os.chmod(p, 0o444)


def place(src: Path, dst: Path) -> None:
    """Make `dst` (a VM's `memory`) the same immutable RAM file as `src` (a snapshot's, or
    a paused VM's), by hard links, so every VM mapping it shares one page cache; its base is
    `src`'s base and runs when it has them (a paused VM's), else `src` itself. Replaces
    `dst` (a placeholder a pooled VMM may still map)."""
    readable(src)
    if src.parent.resolve() == dst.parent.resolve():
        return  # a paused VM restored in its own directory: its files are in place
    src_base = src.with_name(BASE_NAME)
    carried = src_base.exists()
    if carried:
        runs = src.with_name(RUNS_NAME)
        if runs.exists():
            tmp = dst.with_name(f".{RUNS_NAME}.copy")
            shutil.copyfile(runs, tmp)
            os.replace(tmp, dst.with_name(RUNS_NAME))
    else:
        dst.with_name(RUNS_NAME).unlink(missing_ok=True)
    for name, source in ((BASE_NAME, src_base if carried else src), (dst.name, src)):
        tmp = dst.with_name(f".{name}.{os.getpid()}.link")
        tmp.unlink(missing_ok=True)
        os.link(source, tmp)
        os.replace(tmp, dst.with_name(name))
