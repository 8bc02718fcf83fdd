"""The cluster plane's figures (issue 14), against a real etcd on loopback.

Run after `make setup` (Debian's etcd-server; the gateway rows boot VMs: root):
    .venv/bin/python bench/cluster.py [--n 300] [--placers 3] [--ttl 3] [--gateway-runs 30]

- placement decision + commit (`placement.place`: read the reservations, choose, one
  transaction), one placer alone, p50/p95;
- placement throughput with `--placers` clients at once (as from that many gateways) over
  8 nodes, and how many transactions each placement lost to the others;
- `release`, p50;
- a node's lease left to expire (its registration stops renewing, as after a kill -9):
  the time from its last renewal until a watching `Members` view drops it, against the TTL.

- through a gateway against the node directly, one real node (VMs) and `aenv gateway`
  on this host, each pair interleaved: create (`POST /v2/sandboxes`), exec (the SDK's
  `commands.run("true")`) and a proxied HTTP request (the agent's `GET /health`), as p50
  ratios; then proxied requests per second, through the gateway and direct (wrk).

- snapshot transfer (bench/transfer_rows.py): a real snapshot published to a loopback S3
  (moto) and fetched back, and fetched from its node as a peer; throughput over its logical
  size, and the bytes that moved (zero chunks never do).

Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from node import Node, gateway_for, interleaved, pct, rps  # bench/node.py
from transfer_rows import transfer_rows

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


def _gateway(endpoints: list[str], runs: int, seconds: int, transfers: bool
             ) -> dict[str, str]:  # fmt: skip
    import tempfile

    import httpx
    from e2b import Sandbox

    tmp = Path(tempfile.mkdtemp(prefix="aenv-bench-gw-"))
    env = {"AENV_ETCD_ENDPOINTS": ",".join(endpoints), "AENV_CLUSTER_TOKEN": "bench-token",
           "AENV_CLUSTER_PREFIX": f"/bench{os.urandom(3).hex()}/", "AENV_NODE_NAME": "b0",
           "AENV_PRIMED_POOL_SIZE": "0"}  # fmt: skip
    node = Node(tmp / "node.log", **env)
    node.start()
    gw, via = gateway_for(node, env, tmp / "gateway.log")
    rows: dict[str, str] = {}
    try:
        headers = {"X-API-Key": node.key}
        with httpx.Client(base_url=via, headers=headers, timeout=120) as g, \
                httpx.Client(base_url=node.origin, headers=headers, timeout=120) as d:

            def create(c: httpx.Client) -> float:
                t0 = time.perf_counter()
                r = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 120})
                took = time.perf_counter() - t0
                r.raise_for_status()
                c.delete(f"/sandboxes/{r.json()['sandboxID']}").raise_for_status()
                return took

            create(g), create(d)  # warm both paths
            xg, xd = [], []
            for i in range(runs):  # interleaved, alternating which goes first
                first, second = (g, d) if i % 2 == 0 else (d, g)
                a, b = create(first), create(second)
                xg.append(a if first is g else b)
                xd.append(b if first is g else a)
            rows["create via gateway / direct (p50)"] = _ratio(xg, xd)

            sbx = g.post("/v2/sandboxes", json={"templateID": "base", "timeout": 600}).json()
            sid, token = sbx["sandboxID"], sbx["envdAccessToken"]
            on_gw = Sandbox.connect(sid, api_key=node.key, api_url=via, sandbox_url=via)
            on_node = Sandbox.connect(sid, api_key=node.key, api_url=node.origin,
                                      sandbox_url=node.origin)  # fmt: skip
            xg, xd = interleaved(lambda: on_gw.commands.run("true"),
                                 lambda: on_node.commands.run("true"), runs)  # fmt: skip
            rows["exec (commands.run) via gateway / direct (p50)"] = _ratio(xg, xd)

            route = {"E2b-Sandbox-Id": sid, "X-Access-Token": token}
            with httpx.Client(base_url=via, headers=route) as pg, \
                    httpx.Client(base_url=node.origin, headers=route) as pd:
                xg, xd = interleaved(lambda: pg.get("/health").raise_for_status(),
                                     lambda: pd.get("/health").raise_for_status(),
                                     runs * 10)  # fmt: skip
            rows["proxied GET via gateway / direct (p50)"] = _ratio(xg, xd)
            r_g, how = rps(via + "/health", seconds, {"E2b-Sandbox-Id": sid})
            r_d, _ = rps(node.origin + "/health", seconds, {"E2b-Sandbox-Id": sid})
            rows[f"proxied req/s, gateway / direct ({how})"] = f"{r_g:.0f} / {r_d:.0f}"
            g.delete(f"/sandboxes/{sid}")
            if transfers:
                rows.update(transfer_rows(g, node.origin, env["AENV_CLUSTER_TOKEN"]))
    finally:
        gw.terminate()
        gw.wait(30)
        node.stop()
    return rows


def _ratio(via: list[float], direct: list[float]) -> str:
    a, b = statistics.median(via), statistics.median(direct)
    return f"{a / b:.3f}x ({a * 1e3:.2f} ms / {b * 1e3:.2f} ms, {len(via)} pairs)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--placers", type=int, default=3)
    ap.add_argument("--ttl", type=int, default=3)
    ap.add_argument("--lost-runs", type=int, default=3)
    ap.add_argument("--gateway-runs", type=int, default=30, help="0: no gateway rows")
    ap.add_argument("--seconds", type=int, default=5, help="each req/s measurement")
    ap.add_argument("--no-transfer", action="store_true", help="no snapshot transfer rows")
    args = ap.parse_args()
    with etcd_cluster(1) as c:
        rows = asyncio.run(_placements(c.endpoints, args.n, args.placers))
        rows.update(asyncio.run(_lost_node(c.endpoints, args.ttl, args.lost_runs)))
        if args.gateway_runs:
            rows.update(_gateway(c.endpoints, args.gateway_runs, args.seconds,
                                 not args.no_transfer))
    print()
    for k, v in rows.items():
        print(f"{k:<52} {v}")


if __name__ == "__main__":
    main()
