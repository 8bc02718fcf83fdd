"""Bursts of creates and forks (issue 31): transport errors, 5xx and 429s, time until all ran,
and the admission wait, for 64, 128 and 256 simultaneous creates of `base-minimal` against a
node with `max_sandboxes` 64, straight and through a gateway (a real etcd on loopback); and
16 clients forking 4 children each at once.

Run as root after `make setup`:  .venv/bin/python bench/burst.py [--sizes 64,128,256]

Each create is a client of its own (raw HTTP, so every answer is counted): on 429 it waits
what `Retry-After` says and tries again, as the SDK does; once its sandbox runs it kills it
(so a burst past 64 completes as places free up). "admission wait" is the node's own
measure (`aenv_admission_wait_seconds`: how long creates queued for a boot slot); "create"
the client's time for the attempt that succeeded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node import Node, gateway_for, pct  # bench/node.py

from tests.support.etcd import etcd_cluster

TEMPLATE = "base-minimal"


@dataclass
class Tally:
    transport: int = 0
    server_errors: int = 0
    limited: int = 0
    done: int = 0
    created_s: list[float] = field(default_factory=list)


async def _one(c: httpx.AsyncClient, t: Tally) -> None:
    while True:
        t0 = time.perf_counter()
        try:
            r = await c.post("/v2/sandboxes", json={"templateID": TEMPLATE, "timeout": 300})
        except httpx.HTTPError:
            t.transport += 1
            await asyncio.sleep(1)
            continue
        if r.status_code == 429:
            t.limited += 1
            await asyncio.sleep(int(r.headers.get("retry-after", "1")))
            continue
        if r.status_code >= 500:
            t.server_errors += 1
            await asyncio.sleep(1)
            continue
        r.raise_for_status()
        t.created_s.append(time.perf_counter() - t0)
        await c.delete(f"/sandboxes/{r.json()['sandboxID']}")
        t.done += 1
        return


async def _fork_burst(c: httpx.AsyncClient, t: Tally) -> None:
    parents = []
    for _ in range(16):
        r = await c.post("/v2/sandboxes", json={"templateID": TEMPLATE, "timeout": 300})
        r.raise_for_status()
        parents.append(r.json()["sandboxID"])

    async def fork(sid: str) -> list[str]:
        t0 = time.perf_counter()
        try:
            r = await c.post(f"/sandboxes/{sid}/fork", json={"count": 4})
        except httpx.HTTPError:
            t.transport += 1
            return []
        if r.status_code >= 500:
            t.server_errors += 1
            return []
        t.created_s.append(time.perf_counter() - t0)
        kids = []
        for e in r.json():
            if "sandbox" in e:
                kids.append(e["sandbox"]["sandboxID"])
            elif e["error"]["code"] == 429:
                t.limited += 1
            else:
                t.server_errors += 1
        t.done += len(kids)
        return kids

    kids = [k for ks in await asyncio.gather(*(fork(p) for p in parents)) for k in ks]
    await asyncio.gather(*(c.delete(f"/sandboxes/{s}") for s in [*parents, *kids]))


def _admission_wait(node: Node) -> tuple[float, float]:
    """The node's histogram as (count, sum) so far."""
    text = httpx.get(node.origin + "/metrics", timeout=10).text
    count = re.search(r"^aenv_admission_wait_seconds_count (\S+)$", text, re.M)
    total = re.search(r"^aenv_admission_wait_seconds_sum (\S+)$", text, re.M)
    return (float(count.group(1)) if count else 0.0, float(total.group(1)) if total else 0.0)


async def _run(origin: str, key: str, node: Node, what: str, n: int) -> list[str]:
    t = Tally()
    before = _admission_wait(node)
    limits = httpx.Limits(max_connections=n + 16, max_keepalive_connections=n + 16)
    async with httpx.AsyncClient(base_url=origin, headers={"X-API-Key": key}, timeout=300,
                                 limits=limits) as c:  # fmt: skip
        t0 = time.perf_counter()
        if what == "fork":
            await _fork_burst(c, t)
        else:
            await asyncio.gather(*(_one(c, t) for _ in range(n)))
        took = time.perf_counter() - t0
    after = _admission_wait(node)
    waited = after[0] - before[0]
    mean_wait = (after[1] - before[1]) / waited if waited else 0.0
    return [what, str(n), str(t.transport), str(t.server_errors), str(t.limited),
            f"{took:.1f} s", f"{pct(t.created_s, 50):.1f} / {pct(t.created_s, 99):.1f} s",
            f"{int(waited)} queued, mean {mean_wait:.1f} s"]


def _settle(node: Node) -> None:
    """Each burst starts from an empty node whose cluster records have caught up."""
    with node.api() as c:
        while c.get("/v2/sandboxes").json():
            time.sleep(0.5)
    time.sleep(6)  # a node's record and reservation follow within its intervals (1-5 s)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64,128,256")
    ap.add_argument("--via", default="node,gateway")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    with etcd_cluster(1) as etcd, tempfile.TemporaryDirectory() as tmp:
        env = {"AENV_ETCD_ENDPOINTS": ",".join(etcd.endpoints),
               "AENV_CLUSTER_TOKEN": "bench-token", "AENV_NODE_NAME": "b0",
               "AENV_CLUSTER_PREFIX": f"/burst{os.urandom(3).hex()}/",
               "AENV_MAX_SANDBOXES": "64", "AENV_PRIMED_POOL_SIZE": "0"}  # fmt: skip
        node = Node(Path(tmp, "node.log"), **env)
        node.start()
        gw, via = gateway_for(node, env, Path(tmp, "gateway.log"))
        try:
            for where, origin in (("node", node.origin), ("gateway", via)):
                if where not in args.via.split(","):
                    continue
                for n in sizes:
                    _settle(node)
                    row = asyncio.run(_run(origin, node.key, node, "create", n))
                    rows.append([where, *row])
                    print(" | ".join(rows[-1]), flush=True)
                _settle(node)
                rows.append([where, *asyncio.run(_run(origin, node.key, node, "fork", 64))])
                print(" | ".join(rows[-1]), flush=True)
        finally:
            gw.terminate()
            gw.wait(30)
            node.stop()
    head = ["via", "burst", "size", "transport errors", "5xx", "429s", "all ran in",
            "create p50 / p99", "admission queue"]
    print("\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
