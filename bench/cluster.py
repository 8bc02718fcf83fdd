"""The cluster plane's figures that exist so far (issue 14), against a real etcd on loopback.

Run as root or not, after `make setup` (Debian's etcd-server):
    .venv/bin/python bench/cluster.py [--n 300] [--placers 3] [--ttl 3]

- placement decision + commit (`placement.place`: read the reservations, choose, one
  transaction), one placer alone, p50/p95;
- placement throughput with `--placers` clients at once (as from that many gateways) over
  8 nodes, and how many transactions each placement lost to the others;
- `release`, p50;
- a node's lease left to expire (its registration stops renewing, as after a kill -9):
  the time from its last renewal until a watching `Members` view drops it, against the TTL.

Gateway overhead, gateway throughput and snapshot transfer rows come with those parts.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from node import pct  # bench/node.py

from aenv.cluster.etcd import Etcd, TxnResult
from aenv.cluster.membership import Capacity, Members, NodeRecord, Registration
from aenv.cluster.placement import PlacementRequest, place, release
from tests.support.etcd import etcd_cluster


def _nodes(n: int) -> list[NodeRecord]:
    return [NodeRecord(name=f"n{i}", url=f"http://n{i}", version="bench",
                       capacity=Capacity(max_sandboxes=10_000, memory_mib=1 << 30))
            for i in range(n)]  # fmt: skip


async def _placements(endpoints: list[str], n: int, placers: int) -> dict[str, str]:
    out: dict[str, str] = {}
    clients = [Etcd(endpoints) for _ in range(placers)]
    nodes = _nodes(8)
    try:
        one = clients[0]
        prefix = f"/bench{os.urandom(3).hex()}/"
        lat = []
        for i in range(n):
            t0 = time.perf_counter()
            await place(one, prefix, nodes, PlacementRequest(f"s{i}", 512))
            lat.append(time.perf_counter() - t0)
        out["place, one placer"] = (f"p50 {pct(lat, 50) * 1e3:.2f} ms, "
                                    f"p95 {pct(lat, 95) * 1e3:.2f} ms")
        rel = []
        for i in range(n):
            t0 = time.perf_counter()
            await release(one, prefix, f"s{i}")
            rel.append(time.perf_counter() - t0)
        out["release"] = f"p50 {pct(rel, 50) * 1e3:.2f} ms"

        lost = 0
        real_txn = Etcd.txn

        async def counting_txn(self: Etcd, *a: object, **k: object) -> TxnResult:
            nonlocal lost
            r = await real_txn(self, *a, **k)  # type: ignore[arg-type]
            lost += not r.succeeded
            return r

        prefix = f"/bench{os.urandom(3).hex()}/"
        Etcd.txn = counting_txn  # type: ignore[method-assign]
        try:
            async def placer(j: int) -> None:
                for i in range(j, n, placers):
                    await place(clients[j], prefix, nodes, PlacementRequest(f"c{i}", 512))

            t0 = time.perf_counter()
            await asyncio.gather(*(placer(j) for j in range(placers)))
            dt = time.perf_counter() - t0
        finally:
            Etcd.txn = real_txn  # type: ignore[method-assign]
        out[f"throughput, {placers} placers at once, 8 nodes"] = (
            f"{n / dt:.0f} placements/s; {lost / n:.2f} lost transactions per placement")
    finally:
        for c in clients:
            await c.aclose()
    return out


async def _lost_node(endpoints: list[str], ttl: int, runs: int) -> dict[str, str]:
    etcd = Etcd(endpoints)
    prefix = f"/bench{os.urandom(3).hex()}/"
    members = Members(etcd, prefix)
    await members.start()
    delays = []
    try:
        for i in range(runs):
            rec = _nodes(1)[0].model_copy(update={"name": f"dead{i}"})
            reg = Registration(etcd, prefix, lambda rec=rec: rec, ttl_s=ttl)
            await reg.start()
            while rec.name not in members.nodes:
                await asyncio.sleep(0.01)
            assert reg._task is not None
            reg._task.cancel()  # dead: no renewal, no revoke
            while rec.name in members.nodes:
                await asyncio.sleep(0.01)
            delays.append(time.monotonic() - reg.renewed_at)
    finally:
        await members.stop()
        await etcd.aclose()
    return {f"node lost: last renewal to dropped from the view (TTL {ttl} s)":
            f"p50 {pct(delays, 50):.2f} s, max {max(delays):.2f} s over {runs} runs"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--placers", type=int, default=3)
    ap.add_argument("--ttl", type=int, default=3)
    ap.add_argument("--lost-runs", type=int, default=3)
    args = ap.parse_args()
    with etcd_cluster(1) as c:
        rows = asyncio.run(_placements(c.endpoints, args.n, args.placers))
        rows.update(asyncio.run(_lost_node(c.endpoints, args.ttl, args.lost_runs)))
    print()
    for k, v in rows.items():
        print(f"{k:<52} {v}")


if __name__ == "__main__":
    main()
