"""Resource limits for one VMM process: a cgroup with memory, pids and cpu limits.

cgroup v2 when the unified hierarchy has the controllers; otherwise (hosts still on the
v1/hybrid layout, like this CI machine) one group per v1 controller hierarchy. The rest of
aenv only sees `Cgroup`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
GROUP = "aenv"
# CPU weights: the kernel's defaults, and 10x that for a group `first()` (v2, v1).
WEIGHT, WEIGHT_FIRST = 100, 1000
SHARES, SHARES_FIRST = 1024, 10240


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    pids: int
    cpus: float  # CPU bandwidth in cores


def unified() -> bool:
    controllers = ROOT / "cgroup.controllers"
    return controllers.exists() and {"memory", "pids", "cpu"} <= set(
        controllers.read_text().split()
    )


class Cgroup:
    def __init__(self, name: str) -> None:
        self.name = name
        self.v2 = unified()
        if self.v2:
            self.dirs = {"": ROOT / GROUP / name}
        else:
            self.dirs = {c: ROOT / c / GROUP / name for c in ("memory", "pids", "cpu")}

    def create(self, limits: Limits) -> None:
        if self.v2:
            parent = ROOT / GROUP
            parent.mkdir(exist_ok=True)
            # Controllers must be enabled on every ancestor for the leaf to get them.
            for p in (ROOT, parent):
                with contextlib.suppress(OSError):
                    (p / "cgroup.subtree_control").write_text("+memory +pids +cpu")
            d = self.dirs[""]
            d.mkdir(exist_ok=True)
            (d / "memory.max").write_text(str(limits.memory_bytes))
            (d / "memory.swap.max").exists() and (d / "memory.swap.max").write_text("0")
            (d / "pids.max").write_text(str(limits.pids))
            (d / "cpu.max").write_text(f"{int(limits.cpus * 100000)} 100000")
            return
        for d in self.dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        (self.dirs["memory"] / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
        (self.dirs["pids"] / "pids.max").write_text(str(limits.pids))
        (self.dirs["cpu"] / "cpu.cfs_period_us").write_text("100000")
        (self.dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(int(limits.cpus * 100000)))

    def proc_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs.values()]

    def enter_self(self) -> None:
        """Move the calling process into the group (used between fork and exec)."""
        for f in self.proc_files():
            with open(f, "w") as fh:
                fh.write("0")

    def pids(self) -> set[int]:
        out: set[int] = set()
        for f in self.proc_files():
            with contextlib.suppress(FileNotFoundError):
                out |= {int(x) for x in f.read_text().split()}
        return out

    def kill(self) -> None:
        kill_file = self.dirs.get("", Path("/nonexistent")) / "cgroup.kill"
        if kill_file.exists():
            kill_file.write_text("1")
            return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, timeout: float = 2.0) -> None:
        """Kill what is left and remove the group; a dying process may linger briefly."""
        deadline = time.monotonic() + timeout
        while True:
            self.kill()
            try:
                for d in self.dirs.values():
                    if d.exists():
                        d.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def oom_kills(self) -> int:
        """How many of the group's processes the kernel's OOM killer ended (0 if unknown)."""
        f = (self.dirs[""] / "memory.events") if self.v2 else (
            self.dirs["memory"] / "memory.oom_control")
        try:
            for line in f.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    @contextlib.contextmanager
    def first(self) -> Iterator[None]:
        """While inside, the group's processes run before others of equal need: a VMM a
        client waits on (a restored guest's first answers) goes before idle ones (under TCG
        each idle guest uses ~3% of a core: 60 of them most of 2 cores). Best effort."""
        self._weight(True)
        try:
            yield
        finally:
            self._weight(False)

    def _weight(self, first: bool) -> None:
        f, value = ((self.dirs[""] / "cpu.weight", WEIGHT_FIRST if first else WEIGHT)
                    if self.v2 else
                    (self.dirs["cpu"] / "cpu.shares", SHARES_FIRST if first else SHARES))
        with contextlib.suppress(OSError):  # a VMM that ended has no group
            f.write_text(str(value))

    def memory_current(self) -> int:
        f = (self.dirs[""] / "memory.current") if self.v2 else (
            self.dirs["memory"] / "memory.usage_in_bytes")
        return int(f.read_text())


def list_groups() -> list[str]:
    base = ROOT / GROUP if unified() else ROOT / "memory" / GROUP
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.exists() else []
