"""A group inside `Cgroup.first()` runs before others (vmm/cgroup.py): two busy processes
pinned to one CPU, one of them first, share it about 10:1 instead of 1:1. Real cgroups."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from aenv.vmm.cgroup import Cgroup, Limits

SPIN = "while True: pass"


def _spin(cg: Cgroup) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", SPIN])
    for f in cg.proc_files():
        f.write_text(str(p.pid))
    return p


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _shares(a: int, b: int, seconds: float = 2.0) -> tuple[float, float]:
    a0, b0 = _cpu_s(a), _cpu_s(b)
    time.sleep(seconds)
    return _cpu_s(a) - a0, _cpu_s(b) - b0


def test_a_group_first_gets_most_of_a_shared_cpu() -> None:
    tag = secrets.token_hex(3)
    groups = [Cgroup(f"test-first-{tag}"), Cgroup(f"test-other-{tag}")]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for g in groups:
            g.create(Limits(memory_bytes=256 << 20, pids=16, cpus=1.0))
        procs = [_spin(g) for g in groups]
        with groups[0].first():
            first, other = _shares(procs[0].pid, procs[1].pid)
        assert first > 4 * other, (first, other)
        first, other = _shares(procs[0].pid, procs[1].pid)  # equal again after
        assert 0.5 < first / other < 2, (first, other)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for g in groups:
            g.remove()
