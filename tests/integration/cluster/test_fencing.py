"""Failure handling on a node (issue 14, item 8), with a real etcd the node reaches through
a TCP proxy the test cuts: a node cut off from etcd fences itself (no VM starts, every
sandbox paused) before its lease ends; back, it frees what another node took over, keeps
the rest and serves again. And drain (`aenv node drain`): no new sandboxes, the running
ones go on or pause."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from aenv.api.app import Node
from aenv.cluster.etcd import Etcd
from aenv.cluster.node import Drain, drain_key
from aenv.cluster.placement import Binding, binding, binding_key
from aenv.config import Config
from aenv.orchestrator.errors import ShuttingDown
from aenv.orchestrator.fake import FakeRuntime
from aenv.orchestrator.requests import CreateRequest
from aenv.orchestrator.states import SandboxState as S
from tests.support.etcd import EtcdCluster
from tests.support.tcp_proxy import TcpProxy

TTL_S = 3


async def _until(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


@pytest.fixture
async def cut_off(tmp_path: Path, one: EtcdCluster) -> AsyncIterator[tuple[Node, TcpProxy, Etcd]]:
    host, port = one.endpoints[0].removeprefix("http://").split(":")
    proxy = TcpProxy(host, int(port))
    await proxy.start()
    prefix = f"/f{os.urandom(3).hex()}/"
    cfg = Config.model_validate({
        "data_dir": tmp_path, "runtime": "fake", "api_key": "k", "transition_wait_s": 5,
        "cluster": {"etcd_endpoints": [proxy.url], "prefix": prefix, "node_name": "nf",
                    "lease_ttl_s": TTL_S}})  # fmt: skip
    node = Node(cfg, FakeRuntime())
    await node.start()
    direct = Etcd(one.endpoints)
    try:
        yield node, proxy, direct
    finally:
        if not proxy.serving:
            await proxy.restore()  # so that the node leaves the cluster cleanly
        await node.close()
        await direct.aclose()
        await proxy.cut()


async def test_a_node_cut_off_from_etcd_fences_itself_before_its_lease_ends(
    cut_off: tuple[Node, TcpProxy, Etcd]
) -> None:
    node, proxy, direct = cut_off
    orch, membership = node.orchestrator, node.membership
    assert membership is not None
    prefix = node.config.cluster.prefix
    a = await orch.create(CreateRequest(template="base", timeout_s=300))
    b = await orch.create(CreateRequest(template="base", timeout_s=300))
    await orch.pause(b.sandbox_id, memory=True, require_healthy_guest=False)
    for sid in (a.sandbox_id, b.sandbox_id):
        for _ in range(100):
            if await binding(direct, prefix, sid) is not None:
                break
            await asyncio.sleep(0.05)

    await proxy.cut()
    await _until(lambda: orch.fenced, "the fence", timeout=TTL_S + 2)
    fenced_after = time.monotonic() - membership.registration.renewed_at
    # It fenced with half the lease left, and everything was paused inside the lease (the
    # flag is up as the pauses begin: CI once read `a` before its pause ended).
    assert fenced_after < TTL_S, fenced_after
    await _until(lambda: orch.store.get(a.sandbox_id).state is S.PAUSED,  # type: ignore[union-attr]
                 "a's pause", timeout=TTL_S)
    assert time.monotonic() - membership.registration.renewed_at < TTL_S
    with pytest.raises(ShuttingDown, match="fenced"):
        await orch.create(CreateRequest(template="base", timeout_s=60))
    with pytest.raises(ShuttingDown, match="fenced"):
        await orch.connect(a.sandbox_id, 60, True)

    # Meanwhile the cluster counts it lost, and another node takes b over.
    taken = Binding(node="elsewhere", memory_mib=b.memory_mib, template="base", holds=True)
    await direct.put(binding_key(prefix, b.sandbox_id), taken.model_dump_json())

    await proxy.restore()
    await _until(lambda: not orch.fenced, "the node to serve again", timeout=20)
    assert orch.store.get(b.sandbox_id) is None  # freed here: it lives elsewhere now
    kept = await binding(direct, prefix, a.sandbox_id)
    assert kept is not None and kept.node == "nf"
    rec, resumed = await orch.connect(a.sandbox_id, 60, True)
    assert resumed and rec.state is S.RUNNING
    c = await orch.create(CreateRequest(template="base", timeout_s=60))
    for sid in (a.sandbox_id, c.sandbox_id):
        await orch.kill(sid)
    await direct.delete(binding_key(prefix, b.sandbox_id))


async def test_drain_stops_new_sandboxes_and_with_pause_pauses_the_running_ones(
    cut_off: tuple[Node, TcpProxy, Etcd]
) -> None:
    node, _, direct = cut_off
    orch, membership = node.orchestrator, node.membership
    assert membership is not None
    key = drain_key(node.config.cluster.prefix, "nf")
    a = await orch.create(CreateRequest(template="base", timeout_s=300))
    await direct.put(key, Drain().model_dump_json())
    await _until(lambda: not orch.accepting, "the drain")
    with pytest.raises(ShuttingDown, match="draining"):
        await orch.create(CreateRequest(template="base", timeout_s=60))
    assert orch.store.get(a.sandbox_id).state is S.RUNNING  # type: ignore[union-attr]
    await _until(lambda: membership.registration._published is not None
                 and membership.registration._published["draining"] is True, "the record")
    await direct.put(key, Drain(pause=True).model_dump_json())
    await _until(lambda: orch.store.get(a.sandbox_id).state is S.PAUSED,  # type: ignore[union-attr]
                 "the pause")
    await direct.delete(key)
    await _until(lambda: orch.accepting, "the undrain")
    c = await orch.create(CreateRequest(template="base", timeout_s=60))
    for sid in (a.sandbox_id, c.sandbox_id):
        await orch.kill(sid)
