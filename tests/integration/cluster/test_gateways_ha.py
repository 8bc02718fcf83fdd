"""Two gateways behind haproxy in front of three nodes (issue 14, "done when"): each a real
process (the nodes on the fake runtime: no VMs), with a real etcd.

- A create storm through both gateways never puts a node over its limit.
- kill -9 of a gateway in the middle of creates: the SDK's retries, each with an
  idempotency key, go through the load balancer to the other gateway, and every key makes
  exactly one sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from tests.support.cluster import Child, cluster_env, fake_node, gateway, gateway_ready, haproxy
from tests.support.etcd import EtcdCluster

KEY = "ha-test-key"
TOKEN = "ha-test-token"
LIMIT = 4  # sandboxes per node


@dataclass
class HA:
    nodes: list[Child]
    gateways: list[Child]
    lb: Child

    def on_node(self, node: Child) -> list[dict]:  # type: ignore[type-arg]
        r = httpx.get(node.origin + "/v2/sandboxes", headers={"X-API-Key": KEY}, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    def kill_all(self) -> None:
        for n in self.nodes:
            for s in self.on_node(n):
                httpx.delete(f"{n.origin}/sandboxes/{s['sandboxID']}",
                             headers={"X-API-Key": KEY}, timeout=10)  # fmt: skip


@contextlib.contextmanager
def ha(tmp: Path, etcd: EtcdCluster, **node_env: str) -> Iterator[HA]:
    env = cluster_env(etcd.endpoints, f"/ha{os.urandom(3).hex()}/", TOKEN)
    procs: list[Child] = []
    try:
        nodes = [fake_node(tmp, f"n{i}", env, KEY, AENV_MAX_SANDBOXES=str(LIMIT), **node_env)
                 for i in range(3)]  # fmt: skip
        for n in nodes:
            procs.append(n)
            n.start()
        gws = [gateway(tmp, f"g{i}", env, KEY) for i in range(2)]
        for g in gws:
            procs.append(g)
            g.start(gateway_ready(g, len(nodes)))
        lb = haproxy(tmp, gws)
        procs.append(lb)
        lb.start()
        yield HA(nodes, gws, lb)
    finally:
        for p in reversed(procs):
            if p.proc is not None and p.proc.poll() is None:
                p.stop()
        for p in procs:
            print(f"--- {p.log.name}\n{p.tail(30)}")


async def test_a_create_storm_through_two_gateways_never_overfills_a_node(
    tmp_path: Path, one: EtcdCluster
) -> None:
    with ha(tmp_path, one) as c:
        async def storm() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=c.lb.origin, headers={"X-API-Key": KEY},
                                         timeout=60) as api:  # fmt: skip
                return await asyncio.gather(*(
                    api.post("/sandboxes", json={"templateID": "base", "timeout": 300})
                    for _ in range(40)))  # fmt: skip

        rs = await storm()  # (asyncio.run here would leave later async tests no loop)
        codes = sorted(r.status_code for r in rs)
        assert codes.count(201) == 3 * LIMIT and codes.count(429) == 40 - 3 * LIMIT, codes
        assert all(len(c.on_node(n)) == LIMIT for n in c.nodes)
        c.kill_all()


def test_killing_a_gateway_mid_create_makes_each_keyed_sandbox_exactly_once(
    tmp_path: Path, one: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Creates take 1.5 s on the nodes, so the kill lands while several are in flight.
    with ha(tmp_path, one, AENV_FAKE_BOOT_S="1.5") as c:
        for k, v in {"E2B_API_URL": c.lb.origin, "E2B_SANDBOX_URL": c.lb.origin,
                     "E2B_API_KEY": KEY}.items():  # fmt: skip
            monkeypatch.setenv(k, v)
        keys = [f"key-{i}" for i in range(10)]
        made: dict[str, str] = {}
        errors: list[BaseException] = []
        lock = threading.Lock()

        def create(key: str) -> None:
            try:
                s = Sandbox.create(timeout=300, idempotency_key=key, metadata={"k": key})
                with lock:
                    made[key] = s.sandbox_id
            except BaseException as e:
                errors.append(e)

        with ThreadPoolExecutor(len(keys)) as pool:
            futures = [pool.submit(create, k) for k in keys]
            time.sleep(0.7)  # every create is in flight, half of them through g0
            c.gateways[0].kill9()
            for f in futures:
                f.result()
        assert not errors, errors
        assert sorted(made) == keys
        everywhere = [s for n in c.nodes for s in c.on_node(n)]
        by_key: dict[str, list[str]] = {}
        for s in everywhere:
            by_key.setdefault(s["metadata"]["k"], []).append(s["sandboxID"])
        assert {k: len(v) for k, v in by_key.items()} == dict.fromkeys(keys, 1), by_key
        assert all(by_key[k] == [made[k]] for k in keys)
        c.kill_all()
