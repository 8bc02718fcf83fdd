"""Space admission: keep free space on the data filesystem >= RAM of running sandboxes + a reserve.

A running sandbox's RAM file and disk are sparse reflink clones, so the guest dirtying memory
or writing files needs new blocks, and XFS takes them when the page is first written (a
guest write the filesystem cannot back kills its VMM with SIGBUS). So every running sandbox
keeps room for all of its RAM. The reserve is for everything else that writes: guests'
disk writes, device-state files and manifests, the database. Create, resume, fork and
snapshot that would break the rule are refused (507) before anything is touched. A pause
needs only the reserve: the RAM it flushes already has its blocks, and afterwards its
sandbox needs no room at all.
"""

from __future__ import annotations

import os
from pathlib import Path

MIB = 1 << 20


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path`."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def needed_bytes(running_mib: int, new_mib: int, reserve_mib: int) -> int:
    """Free space an operation needs: the RAM of every sandbox running after it, plus the
    reserve. `new_mib` is the RAM the operation adds (0 for a snapshot)."""
    if running_mib < 0 or new_mib < 0 or reserve_mib < 0:
        raise ValueError("sizes must not be negative")
    return (running_mib + new_mib + reserve_mib) * MIB


def shortfall(free: int, running_mib: int, new_mib: int, reserve_mib: int) -> int:
    """Bytes missing for the operation (0 when it may go ahead)."""
    return max(0, needed_bytes(running_mib, new_mib, reserve_mib) - free)


def explain(running_mib: int, new_mib: int, reserve_mib: int) -> str:
    """What `needed_bytes` added up, for the 507 message."""
    parts = [f"RAM of running sandboxes {running_mib} MiB"] if running_mib else []
    parts += [f"{new_mib} MiB of new RAM"] if new_mib else []
    return " + ".join([*parts, f"reserve {reserve_mib} MiB"])
