"""A sandbox's first command and first terminal, on a primed VM warmed or not (TCG).

Run as root after `aenv setup`:  .venv/bin/python bench/primed.py [--n 7]

Under TCG a restored QEMU translates the guest code it runs for the first time; priming
runs a shell in the VM before it is kept (`machines/guest_warm.py`, `AENV_PRIME_WARM`).
Two nodes in turn (bench/node.py's launcher), each with a primed pool of one, the second
with AENV_PRIME_WARM=0; each create waits until a primed VM is ready, then times with the
unmodified E2B SDK (AsyncSandbox):

- the create;
- the first `commands.run("true")`, then a second one (steady);
- `pty.create` (`/bin/bash -i -l`, as the SDK starts it) until it has answered
  `echo $FOO` on its terminal, in another new sandbox.

p50 of --n; the ratio warm/cold is from the same run. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from node import Node, pct  # bench/node.py: the server launcher

PRIMED = re.compile(r'^aenv_pooled_vms\{kind="primed_pool"\} [1-9]', re.M)
Rows = dict[str, list[float]]


async def primed_ready(node: Node) -> None:
    async with httpx.AsyncClient(base_url=node.origin) as c:
        deadline = time.monotonic() + 120
        while PRIMED.search((await c.get("/metrics")).text) is None:
            if time.monotonic() > deadline:
                raise SystemExit("no primed VM became ready in 120 s")
            await asyncio.sleep(0.1)


async def terminal(sbx) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """A new terminal (`bash -i -l`, as the SDK starts it) answering `echo $FOO`: the
    time `pty.create` took, the time from `send_stdin` until the echo, and the whole."""
    from e2b.sandbox.commands.command_handle import PtySize

    out: list[str] = []
    seen = asyncio.Event()

    def on_data(b: bytes) -> None:
        out.append(b.decode(errors="replace"))
        if "bar" in "".join(out):
            seen.set()

    t0 = time.perf_counter()
    term = await sbx.pty.create(PtySize(80, 24), on_data=on_data, envs={"FOO": "bar"})
    t1 = time.perf_counter()
    await sbx.pty.send_stdin(term.pid, b"echo $FOO\n")
    t2 = time.perf_counter()
    await asyncio.wait_for(seen.wait(), 60)
    t3 = time.perf_counter()
    await sbx.pty.send_stdin(term.pid, b"exit\n")
    await term.wait()
    return t1 - t0, t3 - t2, t3 - t0


async def run(node: Node, n: int, rows: Rows) -> None:
    from e2b import AsyncSandbox

    os.environ.update(E2B_API_KEY=node.key, E2B_API_URL=node.origin,
                      E2B_SANDBOX_URL=node.origin)  # fmt: skip
    for i in range(n + 1):  # the first one is a warm-up of the node and the client
        await primed_ready(node)
        t0 = time.perf_counter()
        sbx = await AsyncSandbox.create("base", timeout=120)
        t1 = time.perf_counter()
        await sbx.commands.run("true")
        t2 = time.perf_counter()
        await sbx.commands.run("true")
        t3 = time.perf_counter()
        await sbx.kill()
        await primed_ready(node)
        sbx = await AsyncSandbox.create("base", timeout=120)
        term = (await terminal(sbx))[2]
        await sbx.kill()
        if i:
            rows["create"].append(t1 - t0)
            rows["first commands.run"].append(t2 - t1)
            rows["second commands.run"].append(t3 - t2)
            rows["pty.create until it echoed"].append(term)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=7)
    args = ap.parse_args()
    results: dict[str, Rows] = {}
    for label, warm in (("warmed", "1"), ("not warmed", "0")):
        rows: Rows = defaultdict(list)
        with tempfile.TemporaryDirectory() as tmp:
            node = Node(Path(tmp) / "server.log", AENV_PRIMED_POOL_SIZE="1",
                        AENV_PRIMED_SNAPSHOT_POOL_SIZE="0", AENV_PRIME_WARM=warm)  # fmt: skip
            node.start()
            try:
                asyncio.run(run(node, args.n, rows))
            finally:
                node.stop()
        results[label] = rows
    w, c = results["warmed"], results["not warmed"]
    print(f"\nprimed creates, p50 of {args.n} (TCG: {os.cpu_count()} cores)\n")
    print(f"| {'':30} |   warmed | not warmed | ratio |")
    print(f"|{'-' * 32}|----------|------------|-------|")
    for k in w:
        a, b = pct(w[k], 50), pct(c[k], 50)
        print(f"| {k:30} | {a * 1000:5.0f} ms | {b * 1000:7.0f} ms | {a / b:5.2f} |")


if __name__ == "__main__":
    main()
