"""Start-up reconciliation after kill -9 of the node with N sandboxes, running and/or paused.

Run as root after `aenv setup`:  .venv/bin/python bench/recovery.py [--n 8] [--rounds 3]
For each mix (all running, all paused, half and half), a node of its own instance creates N
sandboxes of `base` (pausing some) and is killed with -9; a new node process starts on the
same instance and port. The table shows, from the new node's log, `event=recovery.done ms=`
(records resolved, running VMs re-adopted, leftovers reclaimed) with its `reclaim_ms` part,
the reclaim steps in their fixed order (`event=recovery.reclaim`: processes, cgroups,
network, mounts, files; `scan` is the census that finds them, `pool_wait` the wait for the
new warm pool's first VMs, which must not be taken for leftovers), and the time from starting
the process to its first `GET /health` 200 (Python start-up included). The leak census of
the instance must then be clean; every sandbox is killed and the node stops. Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from node import DATA_DIR, Node  # bench/node.py: the server launcher

from aenv import config
from aenv.orchestrator import census as census_mod

STEPS = ("pool_wait", "scan", "processes", "cgroups", "network", "mounts", "files")


def _last_fields(log: Path, event: str) -> dict[str, str]:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if f"event={event} " in ln]
    return dict(re.findall(r"(\w+)=(\S+)", lines[-1])) if lines else {}


def run_once(n: int, paused: int, workdir: Path, label: str) -> dict[str, float]:
    a = Node(workdir / f"{label}-a.log", AENV_WARM_POOL_SIZE="2")
    a.start()
    try:
        with a.api() as c:
            ids = []
            for _ in range(n):
                r = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 900})
                r.raise_for_status()
                ids.append(r.json()["sandboxID"])
            for sid in ids[:paused]:
                c.post(f"/sandboxes/{sid}/pause").raise_for_status()
    finally:
        assert a.proc is not None
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
    b = Node(workdir / f"{label}-b.log", AENV_WARM_POOL_SIZE="2")
    b.instance, b.port, b.origin, b.key = a.instance, a.port, a.origin, a.key
    t0 = time.perf_counter()
    b.start()
    ready = time.perf_counter() - t0
    try:
        cfg = config.load(env={}, data_dir=DATA_DIR, instance=b.instance)
        d = census_mod.diff(census_mod.census(cfg, b.instance))
        if not d.clean:
            print(f"{label}: census after recovery:\n" + "\n".join(d.lines()), file=sys.stderr)
        with b.api() as c:
            listed = c.get("/v2/sandboxes").json()
            for s in listed:
                c.delete(f"/sandboxes/{s['sandboxID']}")
    finally:
        b.stop()
    done = _last_fields(b.log, "recovery.done")
    steps = _last_fields(b.log, "recovery.reclaim")
    out = {
        "recovery": float(done.get("ms", "nan")), "reclaim": float(done.get("reclaim_ms", "nan")),
        "ready": ready * 1000, "adopted": float(done.get("adopted", 0)),
        "paused_kept": float(done.get("kept", 0)) + float(done.get("paused", 0)),
        "reclaimed": float(done.get("reclaimed", 0)), "census_clean": float(d.clean),
    }  # fmt: skip
    out.update({s: float(steps.get(f"{s}_ms", "nan")) for s in STEPS})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8, help="sandboxes before the kill -9")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    mixes = [("running", 0), ("paused", args.n), ("half", args.n // 2)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="aenv-bench-recovery-") as tmp:
        for name, paused in mixes:
            runs = [run_once(args.n, paused, Path(tmp), f"{name}{i}") for i in range(args.rounds)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            rows.append((f"{args.n} {name} ({args.n - paused} run, {paused} paused)", med))
    head = ["sandboxes", "recovery ms", "reclaim ms", *(f"{s} ms" for s in STEPS),
            "to /health ms", "adopted", "kept paused", "reclaimed", "census"]
    print(f"kill -9 of the node, then a new node process; medians of {args.rounds} rounds")
    print(" | ".join(head))
    for name, m in rows:
        cells = [name, f"{m['recovery']:.0f}", f"{m['reclaim']:.0f}",
                 *(f"{m[s]:.1f}" for s in STEPS), f"{m['ready']:.0f}", f"{m['adopted']:.0f}",
                 f"{m['paused_kept']:.0f}", f"{m['reclaimed']:.0f}",
                 "clean" if m["census_clean"] == 1 else "LEAKS"]  # fmt: skip
        print(" | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
