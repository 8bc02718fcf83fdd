"""Start-up reconciliation: end and remove what an earlier process of this node instance left
behind, in a fixed order, each step timed.

The order follows what holds what: processes hold cgroups (a cgroup with a live task
cannot be removed) and their tap fds and files; cgroups go once empty; then the network
slots (namespaces with their taps and nft tables, host veths); then mounts and loop devices
under the instance's VM directories; files last (a live VMM could still write them).
What to find comes from the leak census (`census.census`), so reconciliation and the census
agree on what aenv owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aenv.config import Config

if TYPE_CHECKING:
    from aenv.machines.runtime import Runtime
from aenv.network import pool as slot_pool
from aenv.obs import log_event
from aenv.orchestrator.census import FORK_PREFIX, census
from aenv.storage.files import remove_tree
from aenv.storage.snapshots import SnapshotNotFound, SnapshotStore
from aenv.vmm.cgroup import Cgroup

log = logging.getLogger("aenv.orchestrator")

STEPS = ("processes", "cgroups", "network", "mounts", "files")
PROCESS_EXIT_DEADLINE_S = 5.0  # SIGKILLed VMMs release their memory first
_MNT_DETACH = 2


@dataclass
class Reclaimed:
    """What was removed (`kind:name`) and how long each step took (ms; `scan` first)."""

    items: list[str] = field(default_factory=list)
    ms: dict[str, float] = field(default_factory=dict)


def reclaim(cfg: Config, snapshots: SnapshotStore, *, live_vms: set[str],
            keep_dirs: Iterable[str], keep_slots: Iterable[str],
            keep_volume_servers: Iterable[str] = (),
            pool_wait_ms: float = 0.0) -> Reclaimed:  # fmt: skip
    """Blocking. `live_vms`: the VM (jail) names this process runs; `keep_dirs`: VM
    directory names to keep (live VMs and sandboxes with a record); `keep_slots`: slot
    namespaces this process holds. `pool_wait_ms`: how long the caller waited for its warm
    pool's first VMs (they must count as live), logged with the steps."""
    out = Reclaimed(ms={"pool_wait": round(pool_wait_ms, 1)})
    t0 = time.perf_counter()
    prefix = f"{cfg.instance}-"

    def step(name: str, items: list[str]) -> None:
        nonlocal t0
        now = time.perf_counter()
        out.ms[name] = round((now - t0) * 1000, 1)
        out.items += items
        t0 = now

    c = census(cfg, cfg.instance, deep=False)
    step("scan", [])  # finding what to reclaim: the leak census of this instance
    served = set(keep_volume_servers)  # slot volume servers this process started
    stale = [r for r in c.of("volsrv") if r.owner not in served]
    step("processes", _kill([int(r.name) for r in c.of("process") if r.owner not in live_vms]
                            + [int(r.name) for r in stale if r.name.isdigit()]))
    groups = sorted({r.owner for r in c.of("cgroup") if r.owner and r.owner not in live_vms})
    for g in groups:
        Cgroup(prefix + g).remove()
    step("cgroups", [f"cgroup:{prefix}{g}" for g in groups])
    step("network", slot_pool.reclaim_orphans(prefix, keep_slots))
    step("mounts", _unmount([r.name for r in c.of("mount")], [r.name for r in c.of("loop")]))
    for r in stale:
        if not r.name.isdigit():
            remove_tree(Path(r.name))
    step("files", _files(cfg.sandboxes_dir, snapshots, set(keep_dirs), cfg.instance)
         + [f"volsrv:{r.name}" for r in stale if not r.name.isdigit()])
    log_event(log, "recovery.reclaim", reclaimed=len(out.items),
              **{f"{k}_ms": v for k, v in out.ms.items()})  # fmt: skip
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie has released everything but its pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _kill(pids: list[int]) -> list[str]:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + PROCESS_EXIT_DEADLINE_S
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.005)
    return [f"process:{p}" for p in pids]


def _unmount(mounts: list[str], loops: list[str]) -> list[str]:
    libc = ctypes.CDLL(None, use_errno=True)
    for mp in sorted(mounts, reverse=True):  # deepest first
        if libc.umount2(mp.encode(), _MNT_DETACH) != 0:
            log.warning("reclaim: umount %s: %s", mp, os.strerror(ctypes.get_errno()))
    for dev in loops:
        r = subprocess.run(["losetup", "-d", dev], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            log.warning("reclaim: losetup -d %s: %s", dev, r.stderr.strip())
    return [f"mount:{m}" for m in mounts] + [f"loop:{d}" for d in loops]


def _files(vm_root: Path, snapshots: SnapshotStore, keep: set[str], instance: str
           ) -> list[str]:  # fmt: skip
    if not vm_root.exists():
        return []
    out = []
    entries = list(vm_root.iterdir())
    # A sandbox restored into a pooled VM is a symlink to the pool's directory.
    keep = keep | {p.resolve().name for p in entries if p.name in keep and p.is_symlink()}
    for p in entries:
        if p.name not in keep:
            remove_tree(p)
            out.append(f"dir:{p.name}")
    # A fork that died with the node leaves its transient snapshot, whether its source was
    # kept or not (no fork runs before the node takes calls); so does one this instance
    # fetched from another node to start some of that node's fork children.
    names = {p.name for p in entries}
    for snap in snapshots.list():
        if snap.startswith(FORK_PREFIX) and (
                snap[len(FORK_PREFIX):].rsplit("-", 1)[0] in names
                or _fetched_by(snapshots, snap) == instance):  # fmt: skip
            with contextlib.suppress(SnapshotNotFound):
                snapshots.delete(snap)
            out.append(f"snapshot:{snap}")
    return out


def _fetched_by(snapshots: SnapshotStore, snapshot_id: str) -> str | None:
    """The instance that fetched this copy (its manifest's `fetched`), read as it is: a
    leftover need not be whole."""
    try:
        fetched = json.loads((snapshots.path(snapshot_id) / "manifest.json").read_text())[
            "fetched"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(fetched.get("instance")) if isinstance(fetched, dict) else None


async def reclaim_runtime(rt: Runtime, keep: Iterable[str] = ()) -> list[str]:
    """Reclaim what an earlier node process left behind, in the fixed order of `STEPS`:
    everything of the runtime's instance but the VMs it runs (adopted and hot ones, its
    pools), its slots, and the directories of the sandboxes named in `keep`."""
    t0 = time.perf_counter()
    await rt.settle_pool()  # its pools start filling at start: let those count as live
    done = await asyncio.to_thread(
        reclaim, rt.cfg, rt.snapshots, live_vms=rt.live_vms(),
        keep_dirs=set(keep) | rt.kept_dirs(), keep_slots=rt.slots.owned(),
        keep_volume_servers=rt.volumes.served(),
        pool_wait_ms=(time.perf_counter() - t0) * 1000)
    return done.items
