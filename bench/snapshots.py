"""Snapshot benchmark at the runtime level: pause, resume, create, snapshot, fork.

Run as root after `aenv setup`:  .venv/bin/python bench/snapshots.py [--n 10]
Each figure is API-call-to-agent-answering where an agent is involved (resume, create and
fork include the agent's /init). Prints p50/p95 in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from aenv import config as config_mod
from aenv.orchestrator.runtime import Runtime
from aenv.orchestrator.runtime_api import AgentInit


def p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))] * 1000


async def timed(coro) -> float:
    t0 = time.perf_counter()
    await coro
    return time.perf_counter() - t0


async def main(n: int) -> None:
    cfg = config_mod.load()
    rt = Runtime(cfg)
    await rt.start()
    res: dict[str, list[float]] = {}
    tpl = cfg.default_template
    try:
        sid = "bench" + uuid.uuid4().hex[:8]
        await rt.create(sid, tpl, AgentInit())
        for _ in range(n):
            res.setdefault("pause", []).append(await timed(rt.pause(sid)))
            res.setdefault("resume (to agent /init done)", []).append(
                await timed(rt.resume(sid, AgentInit())))
        for _ in range(n):
            snap = "bench-snap-" + uuid.uuid4().hex[:8]
            res.setdefault("snapshot (running sandbox)", []).append(
                await timed(rt.snapshot_sandbox(sid, snap, [])))
            rt.delete_snapshot(snap)
        for _ in range(n):
            c = "bench" + uuid.uuid4().hex[:8]
            res.setdefault("create from template", []).append(
                await timed(rt.create(c, tpl, AgentInit())))
            await rt.destroy(c)
        for count in (1, 4, 16):
            for _ in range(max(1, n // count)):
                kids = ["bench" + uuid.uuid4().hex[:8] for _ in range(count)]
                t0 = time.perf_counter()
                out = await rt.fork(sid, [(k, AgentInit()) for k in kids])
                res.setdefault(f"fork x{count} (total)", []).append(time.perf_counter() - t0)
                errs = [r for r in out if isinstance(r, BaseException)]
                if errs:
                    print(f"fork x{count}: {len(errs)} failed: {errs[0]!r}")
                for k in kids:
                    await rt.destroy(k)
        await rt.destroy(sid)
    finally:
        await rt.close()
    w = max(map(len, res))
    print(f"\n{'operation (runtime level, TCG)'.ljust(w)}  {'p50 ms':>8}  {'p95 ms':>8}  n")
    for k, xs in res.items():
        print(f"{k.ljust(w)}  {p(xs, 50):8.1f}  {p(xs, 95):8.1f}  {len(xs)}")
    print(f"mean of all pause calls: {statistics.mean(res['pause']) * 1000:.1f} ms")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    asyncio.run(main(ap.parse_args().n))
