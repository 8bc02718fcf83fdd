"""The overcommit mix (issue 30): 32 sandboxes of 512 MiB (16 GiB nominal) in 4 groups of 8
fork children of 4 parents, each taking turns of one command, a pause and 2 s of "model",
for 5 minutes (`--minutes`); once with idle reclaim and overcommit off and a memory budget
that fits them all, once with the node's memory for sandboxes at 1.6 GiB (10x).

Run as root after `aenv setup`:  .venv/bin/python bench/overcommit.py [--minutes M]
A turn is what a trainer sees: the resume (the SDK's connect; a 429 is waited out and
counted) and the command; the command bumps a counter in the guest's RAM (tmpfs) and appends
it to a file on its disk, and its answer must be the turn's number: any other answer is
lost state. OOM kills are the host's (/proc/vmstat oom_kill). Prints a table; exits
non-zero on lost state or an OOM kill (`make test-long` runs it with --minutes 2).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory import Api, bench_node, mib, ms, table
from node import pct

from aenv import config

GROUPS, PER_GROUP = 4, 8
MODEL_S = 2.0
TURN = ("c=$(( $(cat /dev/shm/c) + 1 )) && echo $c > /dev/shm/c && "
        "echo $c >> /home/user/turns && echo $c")  # fmt: skip
RUNS = {
    "off": {"AENV_RECLAIM_IDLE_S": "0", "AENV_MEMORY_OVERCOMMIT": "1",
            "AENV_MEMORY_BUDGET_MIB": str(GROUPS * PER_GROUP * 512 + 1024)},
    "10x": {"AENV_MEMORY_BUDGET_MIB": "1638", "AENV_MEMORY_OVERCOMMIT": "10"},
}  # fmt: skip


@dataclass
class Outcome:
    turns: list[float] = field(default_factory=list)  # seconds each
    refused: int = 0  # 429s waited out
    lost: list[str] = field(default_factory=list)
    peak_held: int = 0  # bytes, the node's sandboxes (aenv_sandbox_memory_bytes)


def oom_kills() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def setup(api: Api, template: str) -> list[str]:
    """4 parents, each forked into 8 children (then ended): 32 sandboxes, all paused. A
    fork gets the children the node's memory holds; the rest come after their pauses."""
    kids: list[str] = []
    for g in range(GROUPS):
        parent = api.create(template)
        try:
            api.sh(parent, f"echo 0 > /dev/shm/c && echo group{g} > /home/user/group")
            need, deadline = PER_GROUP, time.monotonic() + 300
            while need:
                if time.monotonic() > deadline:
                    raise SystemExit(f"group {g}: {need} children not made in 300 s")
                r = api.c.post(f"/sandboxes/{parent}/fork", json={"count": need})
                made = [str(x["sandbox"]["sandboxID"]) for x in api.ok(r).json()
                        if "sandbox" in x]  # fmt: skip
                for k in made:
                    api.pause(k)
                kids += made
                need -= len(made)
                if need:
                    time.sleep(1)
        finally:
            api.kill(parent)
    return kids


def turns(api: Api, sid: str, until: float, out: Outcome, lock: threading.Lock) -> None:
    from e2b import Sandbox
    from e2b.exceptions import RateLimitException

    n = 0
    while time.monotonic() < until:
        n += 1
        t0 = time.perf_counter()
        while True:
            try:
                box = Sandbox.connect(sid, timeout=1800)
                got = box.commands.run(TURN, user="root", timeout=120)
                break
            except RateLimitException:
                with lock:
                    out.refused += 1
                time.sleep(1)
            except Exception as e:  # any other failure is lost state here
                with lock:
                    out.lost.append(f"{sid} turn {n}: {type(e).__name__}: {e}")
                return
        took = time.perf_counter() - t0
        with lock:
            out.turns.append(took)
            if got.stdout.strip() != str(n):
                out.lost.append(f"{sid} turn {n}: counter {got.stdout.strip()!r}")
                return
        api.pause(sid)
        time.sleep(MODEL_S)


def held_now(api: Api) -> int:
    for line in api.c.get("/metrics").text.splitlines():
        if line.startswith("aenv_sandbox_memory_bytes "):
            return int(float(line.split()[1]))
    return 0


def run(env: dict[str, str], minutes: float, template: str) -> Outcome:
    out = Outcome()
    lock = threading.Lock()
    with bench_node(**env) as api:
        kids = setup(api, template)
        until = time.monotonic() + minutes * 60
        try:
            with ThreadPoolExecutor(len(kids)) as pool:
                jobs = [pool.submit(turns, api, k, until, out, lock) for k in kids]
                while not all(j.done() for j in jobs):
                    out.peak_held = max(out.peak_held, held_now(api))
                    time.sleep(2)
                for j in jobs:
                    j.result()
            for k in kids:  # every sandbox still there, its file whole
                r = api.c.get(f"/sandboxes/{k}")
                if r.status_code != 200:
                    out.lost.append(f"{k}: {r.status_code} at the end")
        finally:
            for k in kids:
                api.kill(k)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--only", default="off,10x", help="comma-separated: off, 10x")
    args = ap.parse_args()
    template = config.load().default_template
    rows, p95 = [], {}
    failed = []
    for name in args.only.split(","):
        ooms = oom_kills()
        o = run(RUNS[name], args.minutes, template)
        kills = oom_kills() - ooms
        p95[name] = pct(o.turns, 95) if o.turns else 0.0
        rows.append([name, str(len(o.turns)), ms(pct(o.turns, 50)) if o.turns else "-",
                     ms(p95[name]), f"{p95[name] / p95['off']:.2f}x" if p95.get("off") else "-",
                     str(o.refused), mib(o.peak_held), str(kills), str(len(o.lost))])
        if o.lost or kills:
            failed += [f"{name}: {kills} OOM kills", *o.lost[:10]]
    table(f"overcommit mix: {GROUPS}x{PER_GROUP} fork children, {args.minutes:g} min "
          f"({template}; a turn = resume + command)",
          ["turns", "p50", "p95", "p95 x off", "429s", "peak held", "OOM kills", "lost"], rows)
    if failed:
        raise SystemExit("\n".join(failed))


if __name__ == "__main__":
    main()
