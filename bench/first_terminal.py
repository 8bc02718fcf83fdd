"""A sandbox's first terminal on every restore path (issue 31, item 8).

Run as root after `aenv setup`:  .venv/bin/python bench/first_terminal.py [--n 5]

E2B's own `test_connect_to_pty` gives a new sandbox's first terminal 0.3 s from `send_stdin`
to the echo of `echo $FOO`. Under TCG a QEMU that has not run that code before translates it
(the agent's process start, bash, what the login shell's files run), so the paths differ:
one node with a primed pool of one (`primed`: a VM primed and warmed ahead, machines/
guest_warm.py), then for each other path a sandbox made that way:

- `warm pool`: a create while no primed VM is ready (a pre-spawned QEMU restores `base`);
- `fork child`: `POST /sandboxes/{id}/fork` of a running sandbox;
- `snapshot`: a create from a user snapshot (its first use: no primed VM of it);
- `resume (hot)`: a paused sandbox whose stopped QEMU was kept; `resume (cold)`: one whose
  QEMU was not (`AENV_HOT_PAUSE_S=0` on a second node).

For each: `pty.create` (as the SDK starts it: `bash -i -l`) until it returned, and from the
`send_stdin` of `echo $FOO` until `bar` came back (the SDK test's window). p50 of --n.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from node import Node, pct  # bench/node.py: the server launcher
from primed import primed_ready, terminal

Rows = dict[str, list[tuple[float, float]]]


async def paths(node: Node, n: int, rows: Rows, *, hot: bool) -> None:
    from e2b import AsyncSandbox

    os.environ.update(E2B_API_KEY=node.key, E2B_API_URL=node.origin,
                      E2B_SANDBOX_URL=node.origin)  # fmt: skip
    api = httpx.AsyncClient(base_url=node.origin, headers={"X-API-Key": node.key}, timeout=120)
    resume = "resume (hot)" if hot else "resume (cold)"
    for i in range(n + 1):  # the first round warms the node and the client
        got: dict[str, tuple[float, float, float]] = {}
        if hot:
            await primed_ready(node)
            s = await AsyncSandbox.create("base", timeout=300)
            got["primed"] = await terminal(s)
            await s.kill()
            s = await AsyncSandbox.create("base", timeout=300)  # the primed VM was just taken
            got["warm pool"] = await terminal(s)
            r = await api.post(f"/sandboxes/{s.sandbox_id}/fork", json={"count": 1})
            child = await AsyncSandbox.connect(r.json()[0]["sandbox"]["sandboxID"])
            got["fork child"] = await terminal(child)
            await child.kill()
            r = await api.post(f"/sandboxes/{s.sandbox_id}/snapshots", json={})
            snap = r.json()["snapshotID"]
            t = await AsyncSandbox.create(snap, timeout=300)
            got["snapshot"] = await terminal(t)
            await t.kill()
            await api.delete(f"/templates/{snap}")
        else:
            s = await AsyncSandbox.create("base", timeout=300)
        await s.commands.run("true")
        await s.beta_pause()
        s = await AsyncSandbox.connect(s.sandbox_id)
        got[resume] = await terminal(s)
        await s.kill()
        if i:
            for k, v in got.items():
                rows[k].append(v[:2])
    await api.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=5)
    args = ap.parse_args()
    rows: Rows = defaultdict(list)
    for hot in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            env = {"AENV_PRIMED_POOL_SIZE": "1", "AENV_PRIMED_SNAPSHOT_POOL_SIZE": "0"}
            if not hot:
                env["AENV_HOT_PAUSE_S"] = "0"
            node = Node(Path(tmp) / "server.log", **env)
            node.start()
            try:
                asyncio.run(paths(node, args.n, rows, hot=hot))
            finally:
                node.stop()
    print(f"\na new terminal, p50 of {args.n} (TCG: {os.cpu_count()} cores)\n")
    print(f"| {'path':14} | pty.create | send_stdin until the echo |")
    print(f"|{'-' * 16}|------------|---------------------------|")
    for k, v in rows.items():
        a, b = pct([x for x, _ in v], 50), pct([y for _, y in v], 50)
        print(f"| {k:14} | {a * 1000:7.0f} ms | {b * 1000:22.0f} ms |")


if __name__ == "__main__":
    main()
