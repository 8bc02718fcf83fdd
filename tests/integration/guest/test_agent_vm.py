"""The agent inside a real microVM (QEMU; TCG on this host): what only a VM can show.

Boots one VM with the working tree's agent on its tools drive (tests/support/agent_vm.py)
and checks, through the unmodified SDK: the clock set by /init, user processes in the user
cgroup, a fork bomb and a memory hog contained while the agent keeps answering.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator

import httpx
import pytest

pytestmark = [
    pytest.mark.vm,
    pytest.mark.timeout(900),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to boot microVMs"),
]


@pytest.fixture(scope="module")
def vm_sbx() -> Iterator[tuple[object, str, str]]:
    from e2b import Sandbox

    from aenv.guest.agent.version import ENVD_VERSION
    from tests.support.agent_vm import booted_agent
    from tests.support.e2b_stub import ControlPlaneStub

    loop = asyncio.new_event_loop()
    cm = booted_agent()
    # A VM that does not boot, or an agent whose /init fails, fails the four tests (a broken
    # agent must fail CI, not skip it).
    try:
        url, token, _boot = loop.run_until_complete(cm.__aenter__())
    except BaseException:
        loop.close()
        raise
    try:
        with ControlPlaneStub(envd_version=ENVD_VERSION, envd_token=token, api_key="vm") as stub:
            os.environ.update(E2B_API_URL=stub.url, E2B_SANDBOX_URL=url, E2B_API_KEY="vm")
            yield Sandbox.create(), url, token
    finally:
        loop.run_until_complete(cm.__aexit__(None, None, None))
        loop.close()


def test_init_sets_the_clock(vm_sbx) -> None:  # type: ignore[no-untyped-def]
    sbx, url, token = vm_sbx
    r = httpx.post(url + "/init", json={"timestamp": "2031-05-06T07:08:09Z"}, timeout=30)
    assert r.status_code == 204
    assert sbx.commands.run("date -u +%Y-%m-%d").stdout.strip() == "2031-05-06"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    assert httpx.post(url + "/init", json={"timestamp": now}, timeout=30).status_code == 204
    assert sbx.commands.run("date -u +%Y").stdout.strip() == now[:4]


def test_user_processes_are_in_the_user_cgroup(vm_sbx) -> None:  # type: ignore[no-untyped-def]
    sbx, _url, _token = vm_sbx
    assert sbx.commands.run("cat /proc/self/cgroup").stdout.strip() == "0::/aenv-sandbox/user"
    root = sbx.commands.run("cat /proc/self/cgroup", user="root").stdout.strip()
    assert root == "0::/aenv-sandbox/root"
    assert sbx.commands.run("cat /proc/self/oom_score_adj").stdout.strip() == "100"
    limits = sbx.commands.run("cat /sys/fs/cgroup/aenv-sandbox/pids.max", user="root").stdout
    assert limits.strip() == "4096"


def _kill_user_cgroup(sbx) -> None:  # type: ignore[no-untyped-def]
    sbx.commands.run(
        "echo 1 > /sys/fs/cgroup/aenv-sandbox/user/cgroup.kill", user="root", timeout=120
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = sbx.commands.run("cat /sys/fs/cgroup/aenv-sandbox/pids.current", user="root")
        if int(out.stdout) <= 2:
            return
        time.sleep(1)


def test_fork_bomb_is_contained(vm_sbx) -> None:  # type: ignore[no-untyped-def]
    sbx, url, _token = vm_sbx
    sbx.commands.run("b() { b | b & }; b", background=True, timeout=0)
    try:
        time.sleep(10)
        t0 = time.monotonic()
        assert httpx.get(url + "/health", timeout=30).status_code == 204
        health_s = time.monotonic() - t0
        pids = sbx.commands.run(
            "cat /sys/fs/cgroup/aenv-sandbox/pids.current", user="root", timeout=120
        )
        assert int(pids.stdout) <= 4096
        print(f"during the fork bomb: /health {health_s * 1000:.0f} ms, pids {pids.stdout.strip()}")
    finally:
        _kill_user_cgroup(sbx)
    assert sbx.commands.run("echo alive").stdout == "alive\n"


def test_memory_hog_is_killed_not_the_agent(vm_sbx) -> None:  # type: ignore[no-untyped-def]
    from e2b import CommandExitException

    sbx, url, _token = vm_sbx
    hog = 'python3 -c "x = [bytearray(16 << 20) for _ in range(4096)]"'
    with pytest.raises(CommandExitException) as ei:
        sbx.commands.run(hog, timeout=300)
    assert ei.value.exit_code != 0
    events = sbx.commands.run("cat /sys/fs/cgroup/aenv-sandbox/memory.events", user="root").stdout
    assert int(dict(line.split() for line in events.splitlines())["oom_kill"]) >= 1
    assert httpx.get(url + "/health", timeout=30).status_code == 204
    assert sbx.commands.run("echo alive").stdout == "alive\n"
