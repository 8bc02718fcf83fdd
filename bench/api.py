"""Snapshot operations through the HTTP API, with the raw runtime restore for the API's overhead.

Run as root after `aenv setup`:  .venv/bin/python bench/api.py [--n 10]
It starts its own `aenv server` (bench/node.py's launcher: own AENV_INSTANCE, free loopback
port) on the node's data dir and times, at the client (httpx, keep-alive):

- pause (`POST /sandboxes/{id}/pause`) and resume (`POST /v2/sandboxes/{id}/connect` of the
  paused sandbox, 201), alternating on one sandbox;
- create from the template and from a snapshot (`POST /v2/sandboxes`), both restores (this
  node has no primed pool);
- create from the template on a second node with a primed pool (`AENV_PRIMED_POOL_SIZE=1`),
  each create once its primed VM is ready (`aenv_pooled_vms` on `/metrics`);
- snapshot of a running sandbox (`POST /sandboxes/{id}/snapshots`);
- fork x1, x4, x16 (`POST /sandboxes/{id}/fork`, whole call);

and, in the same run, the raw runtime (`Runtime.create`, in this process, its own instance and
warm pool) restoring the same template and the same snapshot: API overhead = API p50 / raw p50.
Everything created is killed or deleted; nothing is asserted (targets live in the issue).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from node import Node, pct  # bench/node.py: the server launcher

from aenv import config as config_mod
from aenv.machines.api import AgentInit
from aenv.machines.runtime import Runtime
from aenv.orchestrator.reclaim import reclaim_runtime

PRIMED = re.compile(r'^aenv_pooled_vms\{kind="primed_pool"\} [1-9]', re.M)
STAGE = re.compile(r"event=stage op=(\w+) stage=(\w+) .*ms=([\d.]+) outcome=ok")


def timed(fn):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _create(c: httpx.Client, template: str) -> tuple[float, str]:
    dt, r = timed(lambda: c.post("/v2/sandboxes", json={"templateID": template, "timeout": 600}))
    if r.status_code >= 300:
        raise SystemExit(f"create: {r.status_code} {r.text}")
    return dt, r.json()["sandboxID"]


def primed_bench(n: int, res: dict[str, list[float]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        node = Node(Path(tmp) / "server.log", AENV_PRIMED_POOL_SIZE="1")
        node.start()
        try:
            with node.api() as c:
                for i in range(n + 1):  # the first one is a warm-up
                    deadline = time.monotonic() + 120
                    while PRIMED.search(c.get("/metrics").text) is None:
                        if time.monotonic() > deadline:
                            raise SystemExit("no primed VM became ready in 120 s")
                        time.sleep(0.1)
                    dt, sid = _create(c, "base")
                    if i:
                        res["create from template, primed VM ready"].append(dt)
                    c.delete(f"/sandboxes/{sid}")
        finally:
            node.stop()


def api_bench(node: Node, n: int, res: dict[str, list[float]]) -> str:
    """Returns the id of a snapshot it keeps for the raw comparison (deleted by the caller)."""
    with node.api() as c:
        def ok(r):  # type: ignore[no-untyped-def]
            if r.status_code >= 300:
                raise SystemExit(f"{r.request.method} {r.request.url}: {r.status_code} {r.text}")
            return r

        def create(template: str) -> tuple[float, str]:
            return _create(c, template)

        # warm-up: the first create pays imports and a cold pool
        _, sid = create("base")
        c.delete(f"/sandboxes/{sid}")

        for _ in range(n):
            dt, sid = create("base")
            res["create from template"].append(dt)
            ok(c.delete(f"/sandboxes/{sid}"))

        _, src = create("base")
        for _ in range(n):
            dt, _ = timed(lambda: ok(c.post(f"/sandboxes/{src}/pause", json={})))
            res["pause"].append(dt)
            dt, r = timed(lambda: ok(c.post(f"/v2/sandboxes/{src}/connect", json={})))
            assert r.status_code == 201, r.status_code
            res["resume (connect, paused)"].append(dt)

        snaps = []
        for _ in range(n):
            dt, r = timed(lambda: ok(c.post(f"/sandboxes/{src}/snapshots", json={})))
            res["snapshot"].append(dt)
            snaps.append(r.json()["snapshotID"])
        keep = snaps.pop()
        for s in snaps:
            ok(c.delete(f"/templates/{s}"))
        for _ in range(n):
            dt, sid = create(keep)
            res["create from snapshot"].append(dt)
            ok(c.delete(f"/sandboxes/{sid}"))

        for count in (1, 4, 16):
            for _ in range(max(1, n // count)):
                dt, r = timed(lambda count=count: ok(c.post(f"/sandboxes/{src}/fork",
                                                             json={"count": count})))
                out = r.json()
                errs = [o["error"] for o in out if "error" in o]
                if errs:
                    print(f"fork x{count}: {len(errs)} children failed: {errs[0]}")
                res[f"fork x{count} (whole call)"].append(dt)
                for o in out:
                    if "sandbox" in o:
                        ok(c.delete(f"/sandboxes/{o['sandbox']['sandboxID']}"))
        ok(c.delete(f"/sandboxes/{src}"))
        return keep


async def raw_bench(n: int, snapshot: str, res: dict[str, list[float]]) -> None:
    cfg = config_mod.load(instance="r" + os.urandom(3).hex(), primed_pool_size=0)
    rt = Runtime(cfg)
    await rt.start()
    try:
        await asyncio.sleep(2)  # let its warm pool fill, as the node's had time to
        for label, template in (("raw restore: template", cfg.default_template),
                                ("raw restore: snapshot", snapshot)):
            for _ in range(n):
                sid = "raw" + uuid.uuid4().hex[:10]
                t0 = time.perf_counter()
                await rt.create(sid, template, AgentInit())
                res[label].append(time.perf_counter() - t0)
                await rt.destroy(sid)
                await asyncio.sleep(0.3)  # the pool refills in the background
    finally:
        await rt.close()
        await reclaim_runtime(rt)
        with contextlib.suppress(OSError):  # its instance directory, empty by now
            cfg.sandboxes_dir.rmdir()


def stages(log: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for line in log.read_text(errors="replace").splitlines():
        m = STAGE.search(line)
        if m and m.group(1) in ("pause", "resume", "snapshot", "fork", "create"):
            out[f"{m.group(1)}/{m.group(2)}"].append(float(m.group(3)) / 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    args = ap.parse_args()
    res: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        node = Node(log, AENV_PRIMED_POOL_SIZE="0")
        node.start()
        try:
            snap = api_bench(node, args.n, res)
            asyncio.run(raw_bench(args.n, snap, res))
            with node.api() as c:
                c.delete(f"/templates/{snap}")
        finally:
            node.stop()
        inner = stages(log)
    primed_bench(args.n, res)
    w = max(map(len, [*res, *inner])) + 2
    print(f"\n{'operation (TCG; client-side, HTTP API)'.ljust(w)}  {'p50 ms':>8}  {'p95 ms':>8}  n")
    for k, xs in res.items():
        print(f"{k.ljust(w)}  {pct(xs, 50) * 1e3:8.1f}  {pct(xs, 95) * 1e3:8.1f}  {len(xs)}")
    print(f"\n{'inside the node (stage timers)'.ljust(w)}  {'p50 ms':>8}  {'p95 ms':>8}  n")
    for k, xs in sorted(inner.items()):
        print(f"{k.ljust(w)}  {pct(xs, 50) * 1e3:8.1f}  {pct(xs, 95) * 1e3:8.1f}  {len(xs)}")
    print()
    for api, raw in (("create from template", "raw restore: template"),
                     ("create from snapshot", "raw restore: snapshot")):
        if res[api] and res[raw]:
            ratio = pct(res[api], 50) / pct(res[raw], 50)
            print(f"API overhead, {api}: {ratio:.2f}x the raw runtime restore (p50/p50)")


if __name__ == "__main__":
    main()
