"""A real node in a cluster (issue 14, membership): it registers itself in a real etcd under
its lease, publishes its capacity, usage, templates and snapshots as they change, leaves on
shutdown, is lost within its TTL after a kill -9, and refuses to start without etcd.
`aenv cluster status` shows what etcd has."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from tests.support.etcd import EtcdCluster, etcd_cluster, free_port

from .conftest import start_node

pytestmark = pytest.mark.e2e

TTL_S = 3


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdCluster]:
    with etcd_cluster(1) as c:
        yield c


def _get(etcd: EtcdCluster, key: str) -> dict | None:  # type: ignore[type-arg]
    b64 = base64.b64encode(key.encode()).decode()
    r = httpx.post(etcd.endpoints[0] + "/v3/kv/range", json={"key": b64}, timeout=5).json()
    kvs = r.get("kvs", [])
    return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None


def _record(etcd: EtcdCluster, prefix: str, name: str) -> dict | None:  # type: ignore[type-arg]
    return _get(etcd, f"{prefix}nodes/{name}")


def _until(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.1)
    return time.monotonic() - t0


def _cluster_env(etcd: EtcdCluster, prefix: str, name: str) -> dict[str, str]:
    return {"AENV_ETCD_ENDPOINTS": ",".join(etcd.endpoints), "AENV_CLUSTER_PREFIX": prefix,
            "AENV_NODE_NAME": name, "AENV_CLUSTER_LEASE_TTL_S": str(TTL_S)}


def test_a_node_publishes_itself_and_leaves_on_shutdown(
    etcd: EtcdCluster, tmp_path: Path, instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"/t{os.urandom(3).hex()}/"
    node = start_node(tmp_path / "node.log", instance, monkeypatch,
                      **_cluster_env(etcd, prefix, "node-a"))
    snap = None
    try:
        rec = _record(etcd, prefix, "node-a")
        assert rec is not None, node.tail()
        assert rec["url"] == node.origin and "base" in rec["templates"]
        assert rec["capacity"]["max_sandboxes"] > 0 and rec["capacity"]["memory_mib"] > 0
        assert rec["kernel"] and rec["tools"] and rec["accelerator"] in ("kvm", "tcg")
        sbx = Sandbox.create(timeout=300)
        _until(lambda: _record(etcd, prefix, "node-a")["usage"]["sandboxes"] == 1,  # type: ignore[index]
               "usage to show the sandbox")
        # Created here directly, not through a gateway: bound to this node all the same,
        # and its reservation is what it holds; paused, it stays bound and holds nothing.
        bkey, rkey = f"{prefix}bindings/{sbx.sandbox_id}", f"{prefix}reservations/node-a"
        _until(lambda: (_get(etcd, bkey) or {}).get("node") == "node-a", "the binding")
        bound = _get(etcd, bkey)
        assert bound is not None and bound["holds"] is True and bound["memory_mib"] >= 64
        _until(lambda: _get(etcd, rkey) == {"sandboxes": 1, "memory_mib": bound["memory_mib"]},
               "the reservation")
        assert sbx.pause() is True
        _until(lambda: _get(etcd, bkey)["holds"] is False, "the paused binding")  # type: ignore[index]
        _until(lambda: _get(etcd, rkey) == {"sandboxes": 0, "memory_mib": 0}, "the reservation")
        sbx = Sandbox.connect(sbx.sandbox_id)
        _until(lambda: _get(etcd, bkey)["holds"] is True, "the resumed binding")  # type: ignore[index]
        snap = sbx.create_snapshot().snapshot_id
        _until(lambda: snap in _record(etcd, prefix, "node-a")["snapshots"],  # type: ignore[index]
               "the snapshot to be published")
        status = subprocess.run(
            [sys.executable, "-m", "aenv.cli.main", "cluster", "status", "--json",
             "--etcd", etcd.endpoints[0]],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "AENV_CLUSTER_PREFIX": prefix},
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        [shown] = json.loads(status.stdout)
        assert shown["name"] == "node-a" and shown["usage"]["sandboxes"] == 1
        assert shown["reserved"]["sandboxes"] == 1
        sbx.kill()
        _until(lambda: _record(etcd, prefix, "node-a")["usage"]["sandboxes"] == 0,  # type: ignore[index]
               "usage to drop")
        _until(lambda: _get(etcd, bkey) is None, "the binding to go")
        assert _get(etcd, rkey) == {"sandboxes": 0, "memory_mib": 0}
    finally:
        if snap is not None:
            Sandbox.delete_snapshot(snap)
        assert node.stop() == 0, node.tail()
    assert _record(etcd, prefix, "node-a") is None  # the lease went with the node


def test_a_killed_node_is_lost_within_its_ttl_and_a_node_without_etcd_does_not_start(
    etcd: EtcdCluster, tmp_path: Path, instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"/t{os.urandom(3).hex()}/"
    env = {**_cluster_env(etcd, prefix, "node-b"), "AENV_WARM_POOL_SIZE": "0"}
    node = start_node(tmp_path / "b1.log", instance, monkeypatch, **env)
    try:
        assert _record(etcd, prefix, "node-b") is not None
    finally:
        node.kill9()
    lost_after = _until(lambda: _record(etcd, prefix, "node-b") is None, "the node to be lost",
                        timeout=TTL_S + 10)  # fmt: skip
    assert lost_after <= TTL_S + 3  # etcd checks expiry every 500 ms; a loaded host lags
    node = start_node(tmp_path / "b2.log", instance, monkeypatch, **env)  # reclaims, rejoins
    assert node.stop() == 0, node.tail()
    dead = {**env, "AENV_ETCD_ENDPOINTS": f"http://127.0.0.1:{free_port()}"}
    r = subprocess.run(
        [sys.executable, "-m", "aenv.cli.main", "server"], capture_output=True, text=True,
        timeout=300, env={**node.env, **dead, "AENV_PORT": str(free_port())},
    )  # fmt: skip
    assert r.returncode != 0
    assert "no etcd endpoint answered" in r.stderr + r.stdout
