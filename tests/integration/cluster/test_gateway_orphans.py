"""Creates through a gateway that nobody received (cluster/gateway/orphans.py): the gateway
kills the sandbox on its node when its own client left before the answer; with an
`Idempotency-Key`, only if no retry took it within the grace. Real etcd, two real nodes
(fake runtime), real uvicorns."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from aenv.orchestrator.fake import FakeRuntime
from tests.support.etcd import EtcdCluster

from .test_gateway import Cluster, cluster

BOOT_S = 0.6
GRACE_S = 1.0


def _prepare(c: Cluster) -> list[FakeRuntime]:
    c.gateway.orphans.keyed_grace_s = GRACE_S
    runtimes = []
    for n in c.nodes:
        rt = n.orchestrator.runtime
        assert isinstance(rt, FakeRuntime)
        rt.boot_delay_s = BOOT_S
        runtimes.append(rt)
    return runtimes


async def _leave(api: httpx.AsyncClient, **headers: str) -> None:
    # The client leaves once its request is in, while the node boots: the connect itself
    # may take longer on a loaded host (it is not what leaves).
    with pytest.raises(httpx.ReadTimeout):
        await api.post("/v2/sandboxes", json={"templateID": "base"}, headers=headers,
                       timeout=httpx.Timeout(BOOT_S / 2, connect=30))  # fmt: skip


async def _until(cond: object, within_s: float) -> None:
    for _ in range(int(within_s / 0.05)):
        if cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError("not within the time")


async def test_a_create_whose_client_left_the_gateway_is_removed(tmp_path: Path,
                                                                 one: EtcdCluster) -> None:
    async with cluster(tmp_path, one) as c, c.api() as api:
        rts = _prepare(c)

        def live() -> int:
            return sum(len(rt.live) for rt in rts)

        def killed() -> int:
            return sum(len(rt.killed) for rt in rts)

        await _leave(api)
        await _until(lambda: killed() == 1 and live() == 0, BOOT_S * 4)
        assert (await api.get("/v2/sandboxes")).json() == []

        # keyed: its retry (the gateway's claim in etcd) takes it; kept past the grace
        await _leave(api, **{"Idempotency-Key": "g1"})
        await _until(lambda: live() == 1, BOOT_S * 4)
        r = await api.post("/v2/sandboxes", json={"templateID": "base"},
                           headers={"Idempotency-Key": "g1"})  # fmt: skip
        assert r.status_code == 201, r.text
        await asyncio.sleep(GRACE_S + 0.5)
        assert live() == 1 and killed() == 1
        assert [s["sandboxID"] for s in (await api.get("/v2/sandboxes")).json()] == [
            r.json()["sandboxID"]]

        # keyed, with no retry: removed after the grace
        await _leave(api, **{"Idempotency-Key": "g2"})
        await _until(lambda: live() == 2, BOOT_S * 4)
        await _until(lambda: killed() == 2 and live() == 1, GRACE_S * 3)
        assert (await api.delete(f"/sandboxes/{r.json()['sandboxID']}")).status_code == 204
