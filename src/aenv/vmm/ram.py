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
- a VMM that lives on is then "rebased" onto the new file (`rebase`): its written pages stop
  being anonymous memory, which nothing could reclaim on a host without swap, and become
  clean page cache of a file.

Every RAM file the node writes is root-owned and read-only (0444): it is never changed in
place, so it can be hard-linked into a snapshot and mapped by any VM.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from aenv.storage.files import clone, fsync_path
from aenv.vmm.base import VmmError

PAGE = os.sysconf("SC_PAGE_SIZE")
REBASE_SIGNAL = signal.SIGRTMIN + 4
REBASE_TIMEOUT_S = 5.0
SHIM_NAME = "aenv-ram.so"
CTL_NAME = "ram.ctl"
_COPY_CHUNK = 16 << 20
# pagemap: bit 63 present, 62 swapped, 61 file page or shared anonymous. Byte 7 of each
# little-endian entry holds them: a written (anonymous) page is present and not a file page.
_WRITTEN = bytes(0x31 if (b & 0xA0) == 0x80 else 0x30 for b in range(256))
_RUN = re.compile(rb"1+")


class RamError(VmmError):
    pass


@dataclass(frozen=True)
class Mapping:
    """A VMM's guest RAM mapping: [start, end) in the process's address space."""

    pid: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


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
def mapping(pid: int, memory_file: Path, size: int) -> Mapping:
    """The VMM's RAM mapping: the one of `size` bytes whose file is `memory_file` (or was:
    a rename over it leaves " (deleted)" behind until the next rebase)."""
    want = str(memory_file)
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6:
                continue
            path = parts[5].rstrip("\n").removesuffix(" (deleted)")
            lo, _, hi = parts[0].partition("-")
            start, end = int(lo, 16), int(hi, 16)
            if path == want and end - start == size:
                return Mapping(pid, start, end)
    raise RamError(f"process {pid} does not map {memory_file}")


def written_runs(m: Mapping) -> list[tuple[int, int]]:
    """(offset, length) byte runs of guest RAM the guest has written since the mapping's
    file was mapped: its anonymous pages (pagemap: 8 bytes a page)."""
    with open(f"/proc/{m.pid}/pagemap", "rb") as f:
        f.seek((m.start // PAGE) * 8)
        raw = f.read((m.size // PAGE) * 8)
    flags = raw[7::8].translate(_WRITTEN)
    return [(x.start() * PAGE, (x.end() - x.start()) * PAGE) for x in _RUN.finditer(flags)]


def write_back(m: Mapping, base: Path, out: Path) -> int:
    """Write `out`: a clone of `base` (the file mapped) with the guest's written pages over
    it, durable and read-only. The VMM must be stopped. Returns the bytes copied."""
    runs = written_runs(m)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    copied = 0
    try:
        clone(base, tmp)
        mem = os.open(f"/proc/{m.pid}/mem", os.O_RDONLY)
        dst = os.open(tmp, os.O_WRONLY)
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
            os.fsync(dst)
        finally:
            os.close(dst)
            os.close(mem)
        os.chown(tmp, 0, 0)
        tmp.chmod(0o444)
        os.replace(tmp, out)
        fsync_path(out.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return copied


def rebase(pid: int, workdir: Path, target: Path, timeout_s: float = REBASE_TIMEOUT_S
           ) -> None:
    """Have the (stopped) VMM map `target` in place of its RAM mapping (`ramshim.c`)."""
    ctl = workdir / CTL_NAME
    ack = workdir / f"{CTL_NAME}.ack"
    ack.unlink(missing_ok=True)
    ctl.write_text(str(target))
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
        raise RamError(f"VMM {pid} could not rebase its RAM onto {target.name}: {answer}")


def place(src: Path, dst: Path) -> None:
    """`dst` names the same (immutable) RAM file as `src`: a hard link, so every VM mapping
    it shares one page cache. Replaces `dst` (a placeholder a pooled VMM may still map)."""
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.link")
    tmp.unlink(missing_ok=True)
    os.link(src, tmp)
    os.replace(tmp, dst)
