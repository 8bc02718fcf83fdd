"""GET /metrics: ``{ts, cpu_count, cpu_used_pct, mem_total, mem_used, disk_used, disk_total}``."""

from __future__ import annotations

import os
import time


class CpuSampler:
    """CPU use since the previous sample (the first sample covers time since boot)."""

    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None

    @staticmethod
    def _read() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields[:8]), idle

    def percent(self) -> float:
        try:
            total, idle = self._read()
        except (OSError, ValueError, IndexError):
            return 0.0
        last, self._last = self._last, (total, idle)
        d_total = total - last[0] if last else total
        d_idle = idle - last[1] if last else idle
        if d_total <= 0:
            return 0.0
        return round(100.0 * (d_total - d_idle) / d_total, 2)


def memory() -> tuple[int, int]:
    """(total, used) bytes from /proc/meminfo (used = total - available)."""
    values: dict[str, int] = {}
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                values[key] = int(rest.split()[0]) * 1024
    total = values.get("MemTotal", 0)
    return total, total - values.get("MemAvailable", 0)


def collect(cpu: CpuSampler, disk_path: str = "/") -> dict[str, float | int]:
    mem_total, mem_used = memory()
    vfs = os.statvfs(disk_path)
    disk_total = vfs.f_blocks * vfs.f_frsize
    disk_used = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
    return {
        "ts": int(time.time()),
        "cpu_count": os.cpu_count() or 1,
        "cpu_used_pct": cpu.percent(),
        "mem_total": mem_total,
        "mem_used": mem_used,
        "disk_used": disk_used,
        "disk_total": disk_total,
    }
