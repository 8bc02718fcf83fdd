"""Node process lifecycle with real VMs: SIGTERM ends every VM; kill -9 mid-create leaks nothing."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import httpx
import pytest

from .conftest import NodeProcess, free_port, qemu_pids, require_base_template

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _node(tmp_path: Path, name: str) -> NodeProcess:
    # One node instance per test: the second node must find (and reclaim) what the first
    # left, its database, VM directories, jails and warm-pool VMMs included.
    instance = "e" + (str(abs(hash(tmp_path)))[:6])
    n = NodeProcess(free_port(), tmp_path / f"{name}.log",
                    extra_env={"AENV_INSTANCE": os.environ.get("AENV_INSTANCE") or instance})
    n.start()
    return n


def test_sigterm_kills_running_sandboxes_and_exits_0(tmp_path: Path) -> None:
    a = _node(tmp_path, "a")
    try:
        require_base_template(a)
        with a.api() as c:
            ids = [c.post("/v2/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
                   for _ in range(2)]  # fmt: skip
            assert qemu_pids(a.env["AENV_INSTANCE"]), "no QEMU process while sandboxes run"
    finally:
        code = a.stop()
    assert code == 0, a.tail()
    assert not qemu_pids(a.env["AENV_INSTANCE"]), a.tail()
    b = _node(tmp_path, "b")
    try:
        with b.api() as c:
            assert c.get("/v2/sandboxes").json() == []
            for sid in ids:
                assert c.get(f"/sandboxes/{sid}").status_code == 404
    finally:
        assert b.stop() == 0


def test_kill_9_in_the_middle_of_a_create_leaks_nothing(tmp_path: Path) -> None:
    a = _node(tmp_path, "a")
    require_base_template(a)
    result: list[object] = []

    def create() -> None:
        try:
            with a.api() as c:
                result.append(c.post("/v2/sandboxes", json={"templateID": "base"}))
        except httpx.HTTPError as e:
            result.append(e)

    t = threading.Thread(target=create)
    t.start()
    time.sleep(0.3)  # inside the boot
    a.kill9()
    t.join(30)
    b = _node(tmp_path, "b")
    try:
        with b.api() as c:
            assert c.get("/v2/sandboxes").json() == []
            # the node still works
            sid = c.post("/v2/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
            assert c.delete(f"/sandboxes/{sid}").status_code == 204
    finally:
        assert b.stop() == 0, b.tail()
    assert not qemu_pids(b.env["AENV_INSTANCE"]), b.tail()
