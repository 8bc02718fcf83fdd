"""A full data filesystem (issue 7), on a small data filesystem of the test's own
(tests/support/smallfs.py): with less free space than the admission reserve, pause, snapshot
and fork are refused with a clear 507 before they touch anything, the running sandbox keeps
running, and once space is freed every retry goes ahead with nothing lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from e2b import Sandbox

from aenv.network.netns import list_netns
from tests.support.counter import counting
from tests.support.host import qemu_pids
from tests.support.smallfs import MIB, SmallFs, small_fs

from .conftest import NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

RESERVE_MIB = 128
# A process with memory: one tick a second.
COUNTER = counting("/tmp/counter", 1)
KEPT = "/home/user/kept.txt"


@pytest.fixture(scope="module")
def fs() -> Iterator[SmallFs]:
    with small_fs(2, templates=("busybox",)) as f:
        yield f


@pytest.fixture(scope="module")
def small(fs: SmallFs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with fs.busybox_node(tmp_path_factory.mktemp("small"), RESERVE_MIB) as n:
        yield n


def _counter(sbx: Sandbox) -> int:
    return int(sbx.commands.run("cat /tmp/counter").stdout)


def _until(cond: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.2)


def _host_state(fs: SmallFs, instance: str) -> dict[str, object]:
    """What an operation would leave on the host: VM files, snapshots, QEMUs, slots."""
    return {
        "vm files": fs.tree("sandboxes", instance),
        "snapshots": fs.tree("snapshots"),
        "qemus": qemu_pids(instance, fs.data_dir),
        "slots": list_netns(f"{instance}-"),
    }


def test_full_disk_refuses_pause_snapshot_fork_with_507_and_retries_succeed(
    fs: SmallFs, small: NodeProcess
) -> None:
    instance = small.env["AENV_INSTANCE"]
    sbx = Sandbox.create(template="busybox", timeout=600)
    sid = sbx.sandbox_id
    kids: list[str] = []
    try:
        sbx.files.write(KEPT, "survives a full disk")
        sbx.commands.run(COUNTER, background=True, timeout=0)
        sbx.commands.run("until [ -s /tmp/counter ]; do sleep 0.1; done")  # it has started
        _until(lambda: sbx.files.exists("/tmp/counter"))

        # Full, as far as the node is concerned: less than the reserve is left.
        fs.fill_to(RESERVE_MIB * MIB // 2)
        before = _host_state(fs, instance)
        with small.api() as c:
            calls: dict[str, Callable[[], httpx.Response]] = {
                "pause a sandbox": lambda: c.post(f"/sandboxes/{sid}/pause"),
                "take a snapshot": lambda: c.post(f"/sandboxes/{sid}/snapshots", json={}),
                "fork 1 sandboxes": lambda: c.post(f"/sandboxes/{sid}/fork", json={"count": 1}),
            }
            for op, call in calls.items():
                r = call()
                assert r.status_code == 507, (op, r.status_code, r.text)
                body = r.json()
                assert body["code"] == 507, body
                assert f"not enough free space on the data filesystem to {op}" in body["message"]
                assert "MiB free" in body["message"] and "reserve" in body["message"], body
            assert c.get(f"/sandboxes/{sid}").json()["state"] == "running"
            assert [s["sandboxID"] for s in c.get("/v2/sandboxes").json()] == [sid]
            assert c.get("/snapshots").json() == []
        assert _host_state(fs, instance) == before
        # The sandbox ran on through it: the same process counts on, the file is there.
        ticks = _counter(sbx)
        _until(lambda: _counter(sbx) > ticks)
        assert sbx.files.read(KEPT) == "survives a full disk"

        fs.unfill()
        ticks = _counter(sbx)
        assert sbx.pause() is True
        same = Sandbox.connect(sid)
        assert same.files.read(KEPT) == "survives a full disk"
        # The counter went on from where it was: a restarted one would count from 1.
        assert _counter(same) >= ticks
        _until(lambda: _counter(same) > ticks + 1)

        snap = same.create_snapshot()
        from_snap = Sandbox.create(template=snap.snapshot_id, timeout=120)
        kids.append(from_snap.sandbox_id)
        assert from_snap.files.read(KEPT) == "survives a full disk"

        (kid,) = same.fork(count=1)
        assert isinstance(kid, Sandbox), kid
        kids.append(kid.sandbox_id)
        assert kid.files.read(KEPT) == "survives a full disk"
        assert _counter(kid) >= ticks
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    finally:
        fs.unfill()
        for k in kids:
            Sandbox.kill(k)
        Sandbox.kill(sid)
