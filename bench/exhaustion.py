"""Neighbour exec latency while one sandbox exhausts its own VM (issue 7's p50/p99 figure).

Run as root after `aenv setup`:
    .venv/bin/python bench/exhaustion.py [--flood-s 20] [--neighbours 2]
It starts its own `aenv server` (bench/node.py's launcher: its own AENV_INSTANCE, a free
loopback port), creates one bad sandbox and N neighbours of `base`, runs the attack of
tests/support/exhaustion.py (memory hog to OOM, disk fill to ENOSPC, then fork bombs with
console and printk floods for --flood-s seconds) while each neighbour loops `echo ok`
through the E2B SDK, prints the neighbours' latency table, then kills everything and stops
the node. Nothing is asserted (tests/e2e/test_exhaustion.py holds the 10 s bound).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import httpx
from node import Node  # bench/node.py: the server launcher

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flood-s", type=float, default=20.0)
    ap.add_argument("--neighbours", type=int, default=2)
    args = ap.parse_args()

    log = Path(tempfile.mkdtemp(prefix="aenv-bench-exhaustion-")) / "server.log"
    node = Node(log)
    node.start()
    os.environ.update(E2B_API_URL=node.origin, E2B_SANDBOX_URL=node.origin,
                      E2B_API_KEY=node.key)  # fmt: skip
    from e2b import Sandbox

    from tests.support import exhaustion

    made: list[Sandbox] = []
    try:
        bad = Sandbox.create(timeout=600)
        made.append(bad)
        neighbours = [Sandbox.create(timeout=600) for _ in range(args.neighbours)]
        made += neighbours
        outcome = exhaustion.run(bad, neighbours, args.flood_s)
        accel = httpx.get(node.origin + "/health", timeout=10).json().get("accelerator")
        print(f"neighbour `echo ok` while one sandbox exhausts its VM: {args.neighbours} "
              f"neighbours, accelerator {accel}")
        print(outcome.table())
        for f in outcome.failures[:5]:
            print("failure:", f)
    finally:
        for s in made:
            s.kill()
        node.stop()
        print(f"node log: {log}")


if __name__ == "__main__":
    main()
