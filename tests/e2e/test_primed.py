"""The primed pool (`AENV_PRIMED_POOL_SIZE`, runtime.Runtime.prime): creates from the default
template continue a VM restored and run ahead of time. With the unmodified SDK: each such
sandbox has its own env, token, files and entropy, works like any other (pause, resume),
and the pool refills; the node's census is clean after it stops (running_node). Under TCG
each primed VM ran a shell first (`AENV_PRIME_WARM`), which left nothing behind."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from e2b import Sandbox

from .conftest import NodeProcess, running_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

PRIMED = re.compile(r'^aenv_pooled_vms\{kind="primed_pool"\} ([\d.]+)', re.M)


def _wait_primed(node: NodeProcess, want: int, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    with node.api() as c:
        while True:
            m = PRIMED.search(c.get("/metrics").text)
            if m and float(m.group(1)) >= want:
                return
            assert time.monotonic() < deadline, f"the primed pool did not reach {want}"
            time.sleep(0.2)


def test_creates_continue_primed_vms_each_with_its_own_identity(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with running_node(tmp_path_factory.mktemp("node"), AENV_PRIMED_POOL_SIZE="2") as n:
        _wait_primed(n, 2)
        boxes = [Sandbox.create(timeout=300, envs={"WHO": f"box{i}"}) for i in range(2)]
        try:
            log = n.log.read_text()
            # Under TCG priming ran a shell (guest_warm), which left nothing behind: no
            # process, no shell history.
            with n.api() as c:
                tcg = c.get("/health").json()["accelerator"] == "tcg"
            assert re.search(rf"primed pool-\w+ from \S+ \(warmed: {tcg}\)", log), log[-3000:]
            for i, sbx in enumerate(boxes):
                assert f"create {sbx.sandbox_id}: primed VM" in log  # not a restore
                assert sbx.commands.list() == []
                left = sbx.commands.run("ls -a /root /home/user", user="root").stdout
                assert "history" not in left, left
                assert sbx.commands.run("echo $WHO").stdout == f"box{i}\n"
                sbx.files.write("/home/user/who", sbx.sandbox_id)
            for sbx in boxes:
                assert sbx.files.read("/home/user/who") == sbx.sandbox_id
            # Its own token: the data plane refuses a request without it.
            r = httpx.get(f"{n.origin}/files", params={"path": "/home/user/who"},
                          headers={"E2b-Sandbox-Id": boxes[0].sandbox_id,
                                   "E2b-Sandbox-Port": "49983"})  # fmt: skip
            assert r.status_code == 401, r.text
            # Reseeded at its /init: two primed VMs of one template draw different bytes.
            draws = {s.commands.run("head -c 16 /dev/urandom | od -An -tx1").stdout
                     for s in boxes}  # fmt: skip
            assert len(draws) == 2
            # A sandbox made from a primed VM pauses and resumes like any other.
            bg = boxes[0].commands.run("sleep 600", background=True, timeout=0)
            assert boxes[0].pause() is True
            back = Sandbox.connect(boxes[0].sandbox_id)
            assert back.files.read("/home/user/who") == boxes[0].sandbox_id
            assert bg.pid in [p.pid for p in back.commands.list()]
            _wait_primed(n, 2)  # refilled after both takes
        finally:
            for sbx in boxes:
                sbx.kill()
