"""Does pause/resume stay flat? (issue 5): many cycles on one sandbox, and a long fork chain.

Run as root after `aenv setup`:  .venv/bin/python bench/cycles.py [--quick] [--only cycles,chain]
Like bench/memory.py it starts its own `aenv server` and times the HTTP API at the client.

- cycles: 100 pause/resume cycles of one sandbox (`POST /sandboxes/{id}/pause`, then
  `POST /v2/sandboxes/{id}/connect`, 201); p50 of the first 10 vs the last 10, and the
  extents of its RAM file before and after (pause is files, not chains: nothing should grow).
- chain: fork a child from the child 10 times (`POST /sandboxes/{id}/fork`, count 1); each
  parent is paused once it has its child, so its files stay and keep sharing extents with
  its descendants. Then the 10th generation is paused and resumed, next to a fresh sandbox of
  the template as the baseline.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory import Api, bench_node, extents, ms, parse_parts, table
from node import pct

from aenv import config

PARTS = ("cycles", "chain")


def p50(xs: list[float]) -> str:
    return ms(pct(xs, 50))


def cycles(api: Api, quick: bool, template: str) -> None:
    n, edge = (30, 5) if quick else (100, 10)
    sid = api.create(template)
    try:
        first = extents(api.vm_dir(sid) / "memory")
        pauses, resumes = [], []
        for _ in range(n):
            pauses.append(api.pause(sid))
            resumes.append(api.resume(sid))
        api.sh(sid, "true")  # the guest still answers after the last one
        last = extents(api.vm_dir(sid) / "memory")
    finally:
        api.kill(sid)
    rows = [[f"first {edge}", p50(pauses[:edge]), p50(resumes[:edge]), str(first.count)],
            [f"last {edge}", p50(pauses[-edge:]), p50(resumes[-edge:]), str(last.count)],
            ["all", p50(pauses), p50(resumes), ""]]  # fmt: skip
    table(f"{n} pause/resume cycles of one sandbox (HTTP API, p50)",
          ["pause", "resume", "RAM file extents"], rows)  # fmt: skip
    print(f"resume p50, last {edge} / first {edge}: "
          f"{pct(resumes[-edge:], 50) / pct(resumes[:edge], 50):.2f}x")


def chain(api: Api, quick: bool, template: str) -> None:
    gens, rounds = (3, 3) if quick else (10, 5)
    made: list[str] = []
    try:
        made.append(api.create(template))
        forks = []
        for _ in range(gens):
            dt, kid = api.fork(made[-1])
            forks.append(dt)
            api.pause(made[-1])  # the parent's files stay, no CPU of its own
            made.append(kid)
        base = api.create(template)
        made.append(base)
        rows = []
        for label, sid in ((f"generation {gens}", made[gens]), ("fresh from template", base)):
            pauses, resumes = [], []
            for _ in range(rounds):
                pauses.append(api.pause(sid))
                resumes.append(api.resume(sid))
            api.sh(sid, "true")
            ram = extents(api.vm_dir(sid) / "memory")
            rows.append([label, p50(pauses), p50(resumes), str(ram.count)])
    finally:
        for sid in made:
            api.kill(sid)
    table(f"fork chain of {gens} generations, then {rounds} pause/resume (HTTP API, p50)",
          ["pause", "resume", "RAM file extents"], rows)  # fmt: skip
    print(f"fork (count 1) along the chain: p50 {p50(forks)}, first {ms(forks[0])}, "
          f"last {ms(forks[-1])}")


def main() -> None:
    args, parts = parse_parts(__doc__, PARTS)
    template = config.load().default_template
    with bench_node() as api:
        if "cycles" in parts:
            cycles(api, args.quick, template)
        if "chain" in parts:
            chain(api, args.quick, template)


if __name__ == "__main__":
    main()
