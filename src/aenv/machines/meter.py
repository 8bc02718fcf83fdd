"""What running VMs hold of the host's memory, measured (docs/runtime.md, "Guest memory").

PSS splits a page shared by n processes n ways, so the PSS of every VMM summed counts each
snapshot's shared pages once and each sandbox's own pages whole: what admission compares
with the node's budget (orchestrator/memory_admission.py). Per sandbox, its guest-RAM
region's smaps give what the API shows (`hostMemory`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from aenv.vmm import ram

KIB = 1024


@dataclass(frozen=True)
class HostMemory:
    """One sandbox's VMM: its guest RAM (resident, of it shared with other VMs and its own)
    and the whole process's PSS (QEMU's own memory included)."""

    resident: int
    shared: int
    own: int
    pss: int


def process_pss(pid: int) -> int:
    """The process's PSS (smaps_rollup: one cheap read)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * KIB
    return 0


def process_cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def host_memory(pid: int, memory_file: Path) -> HostMemory:
    """From the VMM's smaps: its guest-RAM region's pages, and the process's PSS."""
    region = ram.mapping(pid, memory_file)
    rss = shared = own = pss = 0
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        key, _, rest = line.partition(" ")
        if "-" in key and not key.endswith(":"):
            lo, hi = (int(x, 16) for x in key.split("-"))
            inside = region.start <= lo and hi <= region.end
            continue
        if key == "Pss:":
            pss += int(rest.split()[0]) * KIB
        if not inside:
            continue
        if key == "Rss:":
            rss += int(rest.split()[0]) * KIB
        elif key in ("Shared_Clean:", "Shared_Dirty:"):
            shared += int(rest.split()[0]) * KIB
        elif key in ("Private_Clean:", "Private_Dirty:"):
            own += int(rest.split()[0]) * KIB
    return HostMemory(rss, shared, own, pss)
