"""Snapshot benchmark at the runtime level: pause, resume, create, snapshot, fork.

Run as root after `aenv setup`:  .venv/bin/python bench/snapshots.py [--n 10]
Each figure is API-call-to-agent-answering where an agent is involved (resume, create and
fork include the agent's /init). Prints p50/p95 in ms.

`--first-request` prints where a restore's time goes before the agent has answered: the
restore itself (clone + device state + cont, in a warm-pool QEMU), the guest kernel's first
TCP accept, the agent's first HTTP answer, a second identical one, and then `/init`. Under
TCG the first answer pays for translating the guest code it runs (a fresh QEMU has an empty
translation cache); the second shows the same request translated.

`--checksums` prints only the integrity figures (no VMs; reads the default template's
files, writes nothing): SHA-256 throughput, the time to chunk-hash a template's files (what
the background worker and a scrub pass do per template) and the state check every restore
makes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import socket
import statistics
import time
import uuid

import httpx

from aenv import config as config_mod
from aenv.machines.api import AgentInit
from aenv.machines.runtime import AGENT_PORT, Runtime
from aenv.storage import checksums
from aenv.storage.snapshots import FILES, SnapshotStore, check_restorable
from aenv.storage.templates import TemplateCatalog

MIB = 1 << 20


def p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))] * 1000


def print_table(title: str, res: dict[str, list[float]]) -> None:
    w = max(map(len, [title, *res]))
    print(f"\n{title.ljust(w)}  {'p50 ms':>8}  {'p95 ms':>8}  n")
    for k, xs in res.items():
        print(f"{k.ljust(w)}  {p(xs, 50):8.1f}  {p(xs, 95):8.1f}  {len(xs)}")


async def timed(coro) -> float:
    t0 = time.perf_counter()
    await coro
    return time.perf_counter() - t0


async def main(n: int) -> None:
    cfg = config_mod.load(hot_pause_s=0)  # the restore path (bench/fast.py: the hot tier)
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
        # Filesystem-only: the disk alone (after a guest sync); a create from it cold-boots.
        fs_snaps = ["bench-fsnap-" + uuid.uuid4().hex[:8] for _ in range(n)]
        for snap in fs_snaps:
            res.setdefault("snapshot, filesystem-only", []).append(
                await timed(rt.snapshot_sandbox(sid, snap, [], memory=False)))
        for _ in range(max(1, n // 4)):  # a cold boot takes seconds under TCG
            c = "bench" + uuid.uuid4().hex[:8]
            res.setdefault("create from it (cold boot + /init)", []).append(
                await timed(rt.create(c, fs_snaps[0], AgentInit())))
            await rt.destroy(c)
        for snap in fs_snaps:
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
    print_table("operation (runtime level, TCG)", res)
    print(f"mean of all pause calls: {statistics.mean(res['pause']) * 1000:.1f} ms")


async def first_request(n: int) -> None:
    cfg = config_mod.load()
    rt = Runtime(cfg)
    await rt.start()
    res: dict[str, list[float]] = {}
    try:
        build = rt.template(cfg.default_template).build_id
        for _ in range(n):
            await rt.settle_pool()  # each restore takes a pooled QEMU, as a create does
            name = "bench" + uuid.uuid4().hex[:8]
            t0 = time.perf_counter()
            m = await rt.restore(name, build)
            try:
                t1 = time.perf_counter()
                url = m.slot.url(AGENT_PORT)
                host, port = url.split("//")[1].rsplit(":", 1)
                sock = await asyncio.to_thread(socket.create_connection, (host, int(port)), 30)
                sock.close()
                t2 = time.perf_counter()
                async with httpx.AsyncClient(timeout=30) as c:
                    (await c.get(url + "/health")).raise_for_status()
                    t3 = time.perf_counter()
                    (await c.get(url + "/health")).raise_for_status()
                    t4 = time.perf_counter()
                await rt.push_init(m, AgentInit())
                t5 = time.perf_counter()
            finally:
                await rt.destroy(name)
            for k, v in (("restore (warm pool: clone, state, cont)", t1 - t0),
                         ("guest kernel accepts TCP", t2 - t1),
                         ("agent's first answer (GET /health)", t3 - t2),
                         ("the same request again", t4 - t3),
                         ("then /init (entropy, clock, env, token)", t5 - t4)):
                res.setdefault(k, []).append(v)
    finally:
        await rt.close()
    print_table("after a template restore (TCG)", res)


def bench_checksums(cfg: config_mod.Config, n: int) -> None:
    """Integrity figures on the default template's snapshot (read-only)."""
    store = SnapshotStore(cfg.snapshots_dir)
    sid = TemplateCatalog(cfg.templates_dir).get(cfg.default_template).snapshot_id
    man = store.get(sid)
    rows: list[tuple[str, str]] = []

    buf = memoryview(bytearray(checksums.CHUNK_SIZE))
    t0 = time.perf_counter()
    for _ in range(64):
        hashlib.sha256(buf).digest()
    rows.append(("SHA-256 throughput (4 MiB buffers in memory)",
                 f"{256 / (time.perf_counter() - t0):.0f} MiB/s"))

    times, read = [], 0
    for _ in range(max(1, n // 5)):
        pacer = checksums.Pacer()
        t0 = time.perf_counter()
        for f in FILES:
            checksums.file_sums(store.file(sid, f), pacer=pacer)
        times.append(time.perf_counter() - t0)
        read = pacer.bytes_read
    logical = sum(store.file(sid, f).stat().st_size for f in FILES)
    rows.append((f"chunk-hash template {cfg.default_template!r} (state+memory+disk, p50)",
                 f"{p(times, 50):.0f} ms"))
    rows.append(("  logical size / data read (holes skipped)",
                 f"{logical / MIB:.0f} MiB / {read / MIB:.0f} MiB"))
    rows.append(("  hashing throughput over data read",
                 f"{read / MIB / statistics.median(times):.0f} MiB/s"))

    if man.state_sha256 is None:  # a template stored before state hashes: time the hash too
        man.state_sha256 = checksums.sha256_file(store.file(sid, "state"))
    checks = []
    for _ in range(1000):
        t0 = time.perf_counter()
        check_restorable(store.path(sid), man)
        checks.append(time.perf_counter() - t0)
    rows.append(("state check on every restore (p50 / p95)",
                 f"{p(checks, 50) * 1000:.0f} us / {p(checks, 95) * 1000:.0f} us"))

    w = max(len(k) for k, _ in rows)
    print(f"\n{'snapshot integrity (this host)'.ljust(w)}  value")
    for k, v in rows:
        print(f"{k.ljust(w)}  {v}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--checksums", action="store_true", help="only the integrity figures")
    ap.add_argument("--first-request", action="store_true",
                    help="only where a restore's time goes before the agent answers")
    args = ap.parse_args()
    if args.first_request:
        asyncio.run(first_request(args.n))
        raise SystemExit(0)
    if not args.checksums:
        asyncio.run(main(args.n))
    bench_checksums(config_mod.load(), args.n)
