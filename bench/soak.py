"""Soak: a node under create -> exec -> pause -> resume -> fork -> kill loops for a while;
reports the node's RSS, open fds and threads over time, their slopes per hour, and the leak
census at the end. Not part of the test run.

Run as root after `aenv setup`:
    .venv/bin/python bench/soak.py --duration 600 --workers 2 [--interval 10]
It starts its own `aenv server` (its own AENV_INSTANCE, a free loopback port) on the node's
data dir ($AENV_DATA_DIR, default /var/lib/aenv). Each worker runs the cycle with the E2B SDK
(exec goes through the node's data-plane proxy); the sampler reads /proc of the node process.
Slopes are least-squares fits over the samples after a warm-up (the first fifth of the run,
at most 60 s: pools and caches fill first). Nothing is asserted; exit 1 if a cycle failed or
the census is not clean.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from e2b import Sandbox
from node import DATA_DIR, Node  # bench/node.py: the server launcher

from aenv import config
from aenv.orchestrator import census as census_mod

TTL_S = 600


def sample(pid: int) -> tuple[float, int, int]:
    """(RSS MiB, open fds, threads) of a process."""
    status = dict(ln.split(":", 1) for ln in Path(f"/proc/{pid}/status").read_text().splitlines())
    rss_mib = int(status["VmRSS"].split()[0]) / 1024
    return rss_mib, len(os.listdir(f"/proc/{pid}/fd")), int(status["Threads"])


def slope_per_hour(ts: list[float], ys: list[float]) -> float:
    if len(ts) < 2:
        return float("nan")
    return statistics.linear_regression(ts, ys).slope * 3600


def cycle(stats: Counter[str]) -> None:
    """One create -> exec -> pause -> resume -> fork -> kill round."""
    s = Sandbox.create(timeout=TTL_S)
    kids: list[Sandbox] = []
    try:
        if s.commands.run("echo soak").stdout != "soak\n":
            raise RuntimeError("exec: wrong output")
        s.pause()
        s = Sandbox.connect(s.sandbox_id, timeout=TTL_S)
        kids = [k for k in s.fork(count=1, timeout=TTL_S) if isinstance(k, Sandbox)]
        if len(kids) != 1:
            raise RuntimeError("fork: no child")
        if kids[0].commands.run("echo child").stdout != "child\n":
            raise RuntimeError("exec in the child: wrong output")
        stats["cycles"] += 1
    finally:
        for k in kids:
            k.kill()
        s.kill()


def worker(stop: threading.Event, stats: Counter[str], errors: Counter[str]) -> None:
    while not stop.is_set():
        try:
            cycle(stats)
        except Exception as e:  # keep soaking; the report counts failures by kind
            errors[f"{type(e).__name__}: {str(e)[:80]}"] += 1
            time.sleep(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600, help="seconds")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--interval", type=float, default=10, help="seconds between samples")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="aenv-soak-") as tmp:
        node = Node(Path(tmp) / "node.log", AENV_LOG_LEVEL="info")
        node.start()
        assert node.proc is not None
        os.environ.update(E2B_API_URL=node.origin, E2B_SANDBOX_URL=node.origin,
                          E2B_API_KEY=node.key)  # fmt: skip
        stats: Counter[str] = Counter()
        errors: Counter[str] = Counter()
        stop = threading.Event()
        threads = [threading.Thread(target=worker, args=(stop, stats, errors), daemon=True)
                   for _ in range(args.workers)]  # fmt: skip
        samples: list[tuple[float, float, int, int, int]] = []
        t0 = time.monotonic()
        try:
            for t in threads:
                t.start()
            while (now := time.monotonic() - t0) < args.duration:
                samples.append((now, *sample(node.proc.pid), stats["cycles"]))
                time.sleep(min(args.interval, max(0.0, args.duration - now)))
            samples.append((time.monotonic() - t0, *sample(node.proc.pid), stats["cycles"]))
        finally:
            stop.set()
            for t in threads:
                t.join(120)
        cfg = config.load(env={}, data_dir=DATA_DIR, instance=node.instance)
        live = census_mod.diff(census_mod.census(cfg, node.instance))
        node.stop()  # also removes the instance's (empty) directory and database
        after = census_mod.diff(census_mod.census(cfg, node.instance))

    print(f"soak: {args.duration:.0f} s, {args.workers} workers, {stats['cycles']} cycles "
          f"(create, exec, pause, resume, fork 1, exec in child, kill 2), "
          f"{sum(errors.values())} failed")
    print("t s | node RSS MiB | fds | threads | cycles")
    for t, rss, fds, thr, n in samples:
        print(f"{t:.0f} | {rss:.1f} | {fds} | {thr} | {n}")
    warm = min(60.0, args.duration / 5)
    kept = [s for s in samples if s[0] >= warm] or samples
    ts = [s[0] for s in kept]
    print(f"slopes after {warm:.0f} s of warm-up (per hour): "
          f"RSS {slope_per_hour(ts, [s[1] for s in kept]):+.1f} MiB/h, "
          f"fds {slope_per_hour(ts, [float(s[2]) for s in kept]):+.1f}/h, "
          f"threads {slope_per_hour(ts, [float(s[3]) for s in kept]):+.1f}/h")
    for what, n in errors.most_common():
        print(f"failed {n}x: {what}")
    print("census with the node running:", "clean" if live.clean else "")
    for line in live.lines():
        print("  " + line)
    print("census after it stopped:", "clean" if after.clean else "")
    for line in after.lines():
        print("  " + line)
    return 0 if live.clean and after.clean and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
