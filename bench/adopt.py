"""Node restart after kill -9: how long recovery takes with N running sandboxes re-adopted.

Run as root after `aenv setup`:  .venv/bin/python bench/adopt.py [--n 1 4 8]
For each N, a node of its own instance creates N sandboxes of `base` and is killed with -9;
a new node process starts on the same instance and port. The table shows the new node's
`event=recovery.done ms=…` (records resolved, VMs re-adopted, leftovers reclaimed) with its
`reclaim_ms` part, and the time from starting the process to its first `GET /health` 200
(Python start-up included). Every adopted sandbox's agent must then answer through the
proxy; all are killed and the node stops. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import tempfile
import time
from pathlib import Path

import httpx
from node import Node  # bench/node.py: the server launcher

AGENT_PORT = 49983


def _done_fields(log: Path) -> dict[str, str]:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if "recovery.done" in ln]
    return dict(re.findall(r"(\w+)=(\S+)", lines[-1])) if lines else {}


def run_once(n: int, workdir: Path) -> tuple[str, str, str, str, str]:
    a = Node(workdir / f"a{n}.log")
    a.start()
    try:
        with a.api() as c:
            ids = []
            for _ in range(n):
                r = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 600})
                r.raise_for_status()
                ids.append(r.json()["sandboxID"])
    finally:
        assert a.proc is not None
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait()
    b = Node(workdir / f"b{n}.log")
    b.instance, b.port, b.origin, b.key = a.instance, a.port, a.origin, a.key
    t0 = time.perf_counter()
    b.start()
    to_health = time.perf_counter() - t0
    try:
        with b.api() as c:
            listed = {s["sandboxID"] for s in c.get("/v2/sandboxes").json()}
            for sid in ids:  # through the proxy, to the adopted VM's agent
                h = httpx.get(b.origin + "/health", timeout=10, headers={
                    "E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(AGENT_PORT)})
                if h.status_code != 204:
                    raise SystemExit(f"{sid}: agent answered {h.status_code} via the proxy")
            for sid in listed:
                c.delete(f"/sandboxes/{sid}").raise_for_status()
    finally:
        b.stop()
    f = _done_fields(b.log)
    return (str(n), f"{f.get('adopted', '?')}/{len(ids)}", f"{f.get('ms', '?')} ms",
            f"{f.get('reclaim_ms', '?')} ms", f"{to_health * 1000:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 4, 8], help="sandboxes per run")
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="aenv-bench-adopt-"))
    rows = [("N", "adopted", "recovery.done", "of it reclaim", "start → /health")]
    rows += [run_once(n, workdir) for n in args.n]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; logs in {workdir}")


if __name__ == "__main__":
    main()
