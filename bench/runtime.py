"""Runtime benchmark: cold boot and template restore to agent ready, host memory per sandbox.

Run as root after `aenv setup`:  .venv/bin/python bench/runtime.py [--n 10]
Prints a table; nothing is asserted (targets live in the issue notes).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from pathlib import Path

from aenv import config as config_mod
from aenv.machines.api import AgentInit
from aenv.machines.machine import kernel_cmdline
from aenv.machines.runtime import Runtime
from aenv.storage.tools import ensure_tools


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def main(n: int, idle: int) -> None:
    cfg = config_mod.load()
    rt = Runtime(cfg)
    await rt.start()
    rows: list[tuple[str, str]] = []
    try:
        tpl = rt.catalog.get(cfg.default_template)
        man = rt.snapshots.get(tpl.snapshot_id)
        tools = ensure_tools(cfg.artifacts_dir, log=lambda m: None)
        rootfs = next((cfg.templates_dir / tpl.name).glob("rootfs-*.ext4"))
        t0 = time.perf_counter()
        m = await rt.cold_boot("bench-cold", man.shape, Path(man.kernel), tools, rootfs,
                               kernel_cmdline(cfg.kernel_cmdline_extra))
        cold = time.perf_counter() - t0
        await rt.destroy(m.name)
        rows.append(("cold boot -> agent ready", f"{cold * 1000:.0f} ms"))

        times = []
        for _ in range(n):
            sid = "bench" + uuid.uuid4().hex[:8]
            t0 = time.perf_counter()
            h = await rt.create(sid, cfg.default_template, AgentInit(access_token="x"))
            times.append(time.perf_counter() - t0)
            await rt.kill(h)
        rows.append((f"template restore -> agent /init done (n={n}) p50",
                     f"{statistics.median(times) * 1000:.1f} ms"))
        rows.append(("template restore p95", f"{pct(times, 95) * 1000:.1f} ms"))

        handles = []
        for _ in range(idle):
            handles.append(await rt.create("bench" + uuid.uuid4().hex[:8],
                                           cfg.default_template, AgentInit()))
        await asyncio.sleep(3)
        rss = [rss_kib(h.vmm_pid) for h in handles]
        memcg = [rt.cgroup(h.sandbox_id).memory_current() // 1024 for h in handles]
        rows.append((f"QEMU RSS per idle sandbox (n={idle}) mean",
                     f"{statistics.mean(rss) / 1024:.0f} MiB"))
        rows.append(("cgroup memory per idle sandbox mean",
                     f"{statistics.mean(memcg) / 1024:.0f} MiB"))
        rows.append(("guest RAM per sandbox", f"{man.shape.memory_mib} MiB"))
        for h in handles:
            await rt.kill(h)
        rows.append(("accelerator", rt.accel()))
    finally:
        await rt.close()
    w = max(len(r[0]) for r in rows)
    print(f"\n{'runtime benchmark'.ljust(w)}  value")
    for k, v in rows:
        print(f"{k.ljust(w)}  {v}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--idle", type=int, default=4)
    a = ap.parse_args()
    asyncio.run(main(a.n, a.idle))
