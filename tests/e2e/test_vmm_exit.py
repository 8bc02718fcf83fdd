"""A sandbox whose QEMU exits on its own while the node runs (kill -9 of the QEMU, a guest
poweroff or reboot) disappears as a killed one does: the API answers 404 and no longer
lists it, its open data-plane streams end, the proxy answers 502 "was not found", and its
slot, jail, VM directory and files are released (the leak census shows no ghost and no
leak), while other sandboxes go on. The same for a VM re-adopted after a node restart (not
the node's child: watched through a pidfd), and a warm-pool QEMU is replaced.

Real VMs, a real node, the unmodified e2b SDK; unit tests of the races with operations in
flight: tests/unit/orchestrator/test_vmm_exit.py.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from aenv.orchestrator import census as census_mod
from tests.support import census

from .conftest import (
    API_KEY,
    NodeProcess,
    free_port,
    require_base_template,
    running_node,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# VMM exit -> sandbox gone / stream ended: about a second here; generous for a loaded
# 2-core TCG host where other tests boot VMs at the same time.
GONE_DEADLINE_S = 60
TTL_S = 600
BUSYBOX = "/.aenv/bin/busybox"  # the tools drive's, in every template


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with running_node(tmp_path_factory.mktemp("node"), AENV_WARM_POOL_SIZE="1") as n:
        yield n


def _instance(node: NodeProcess) -> str:
    return node.env["AENV_INSTANCE"]


def _census(instance: str) -> census_mod.Census:
    return census_mod.census(census.cfg_for(instance), instance)


def _vmm_pid(instance: str, sandbox_id: str) -> int:
    pids = _census(instance).vmm_pids(instance, sandbox_id)
    assert len(pids) == 1, pids
    return pids[0]


def _wait(cond: Callable[[], bool], what: str, timeout: float = GONE_DEADLINE_S) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - t0


def _status(node: NodeProcess, sandbox_id: str) -> int:
    with node.api() as c:
        return c.get(f"/sandboxes/{sandbox_id}").status_code


def _listed(node: NodeProcess) -> set[str]:
    with node.api() as c:
        return {s["sandboxID"] for s in c.get("/v2/sandboxes").json()}


def _proxied(node: NodeProcess, sandbox_id: str) -> httpx.Response:
    """The agent's /health through the node's data plane."""
    return httpx.get(node.origin + "/health", timeout=30, headers={
        "E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"})  # fmt: skip


def _killed_line(node: NodeProcess, sandbox_id: str) -> str:
    lines = [ln for ln in node.log.read_text(errors="replace").splitlines()
             if "event=sandbox.killed" in ln and f"sandbox_id={sandbox_id}" in ln]  # fmt: skip
    assert len(lines) == 1, lines
    return lines[0]


def _exits(node: NodeProcess, kind: str) -> float:
    with node.api() as c:
        text = c.get("/metrics").text
    m = re.search(rf'^aenv_vmm_unexpected_exits_total{{kind="{kind}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def _no_ghost_no_leak(instance: str) -> None:
    problems = census.problems(instance)
    assert not problems, "\n".join(problems)


def _wait_gone(node: NodeProcess, sandbox_id: str, why: str) -> float:
    """Seconds until the API answers 404 (from Killing on); then until the record itself
    goes, once the sandbox's resources are released."""
    gone_s = _wait(lambda: _status(node, sandbox_id) == 404, f"the 404 after {why}")
    instance = _instance(node)
    _wait(lambda: sandbox_id not in _census(instance).records.get(instance, {}),
          "the record to go")  # fmt: skip
    return gone_s


def _assert_gone(node: NodeProcess, sbx: Sandbox) -> None:
    """What a client sees of a sandbox whose VM died, and what the host keeps of it."""
    sid = sbx.sandbox_id
    assert _status(node, sid) == 404
    assert sid not in _listed(node)
    r = _proxied(node, sid)
    assert r.status_code == 502 and "was not found" in r.text, (r.status_code, r.text)
    assert Sandbox.kill(sid) is False  # nothing left to kill
    instance = _instance(node)
    assert not (census.cfg_for(instance).sandboxes_dir / sid).exists()
    _no_ghost_no_leak(instance)


def test_readopted_vm_that_dies_is_removed(
    tmp_path: Path, instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After kill -9 of the node, the next node process re-adopts the running VM; the
    launcher is not its child (watched through a pidfd), so the exit status is unknown."""
    port = free_port()
    for k in ("E2B_API_URL", "E2B_SANDBOX_URL"):
        monkeypatch.setenv(k, f"http://127.0.0.1:{port}")
    monkeypatch.setenv("E2B_API_KEY", API_KEY)
    env = {"AENV_INSTANCE": instance, "AENV_WARM_POOL_SIZE": "0"}
    first = NodeProcess(port, tmp_path / "first.log", extra_env=env)
    second = NodeProcess(port, tmp_path / "second.log", extra_env=env)
    try:
        first.start()
        require_base_template(first)
        sbx = Sandbox.create("base", timeout=TTL_S)
        first.kill9()
        second.start()
        assert "event=recovery.adopted" in second.log.read_text()
        assert sbx.commands.run("echo adopted").stdout == "adopted\n"
        os.kill(_vmm_pid(instance, sbx.sandbox_id), signal.SIGKILL)
        _wait_gone(second, sbx.sandbox_id, "kill -9 of its QEMU")
        _assert_gone(second, sbx)
        line = _killed_line(second, sbx.sandbox_id)
        assert "reason=vmm_exited" in line and "signal=" not in line, line
        assert second.stop() == 0, second.tail()
    finally:
        first.kill9()
        second.kill9()


def test_killed_qemu_removes_its_sandbox_and_ends_its_streams(node: NodeProcess) -> None:
    instance = _instance(node)
    exits0 = _exits(node, "sandbox")
    victim, other = Sandbox.create("base", timeout=TTL_S), Sandbox.create("base", timeout=TTL_S)
    try:
        assert _proxied(node, victim.sandbox_id).status_code == 204
        # An open data-plane stream: a command that would run for a day.
        handle = victim.commands.run("sleep 86400", background=True, timeout=0)
        ended: list[BaseException | None] = []

        def follow() -> None:
            try:
                handle.wait()
                ended.append(None)
            except BaseException as e:  # the stream broke: what we expect
                ended.append(e)

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        time.sleep(0.5)
        assert follower.is_alive(), ended

        os.kill(_vmm_pid(instance, victim.sandbox_id), signal.SIGKILL)
        gone_s = _wait_gone(node, victim.sandbox_id, "kill -9 of its QEMU")
        follower.join(GONE_DEADLINE_S)
        assert not follower.is_alive(), "the open command stream did not end"
        print(f"kill -9 of the QEMU -> 404 in {gone_s:.2f} s; the stream ended with {ended}")

        _assert_gone(node, victim)
        line = _killed_line(node, victim.sandbox_id)
        assert "reason=vmm_exited" in line and "signal=SIGKILL" in line, line
        assert _exits(node, "sandbox") == exits0 + 1
        # The other sandbox is untouched.
        assert other.commands.run("echo alive").stdout == "alive\n"
        assert other.sandbox_id in _listed(node)
    finally:
        other.kill()
        victim.kill()


@pytest.mark.parametrize("how", ["poweroff", "reboot"])
def test_guest_poweroff_or_reboot_removes_the_sandbox(node: NodeProcess, how: str) -> None:
    """`poweroff -f` / `reboot -f` as root in the guest (the agent runs commands as root on
    request): QEMU exits with status 0 (a reboot too: -no-reboot), the sandbox goes."""
    sbx = Sandbox.create("base", timeout=TTL_S)
    try:
        # In the background: the guest goes down before the command could answer.
        sbx.commands.run(f"sync; {BUSYBOX} {how} -f", background=True, user="root",
                         timeout=0)  # fmt: skip
        _wait_gone(node, sbx.sandbox_id, f"a guest {how}")
        _assert_gone(node, sbx)
        line = _killed_line(node, sbx.sandbox_id)
        assert "reason=vmm_exited" in line and "exit_code=0" in line, line
    finally:
        sbx.kill()


def test_dead_warm_pool_qemu_is_replaced(node: NodeProcess) -> None:
    instance = _instance(node)
    exits0 = _exits(node, "warm_pool")

    def pooled() -> dict[str, int]:
        """Warm-pool VM name -> its QEMU pid (pooled VMs no sandbox was restored into)."""
        c = _census(instance)
        used = c.aliases(instance)
        return {r.owner or "": int(r.name) for r in c.of("process", instance)
                if "qemu" in r.detail and (r.owner or "").startswith("pool-")
                and r.owner not in used}  # fmt: skip

    _wait(lambda: len(pooled()) == 1, "the warm pool to fill", timeout=120)
    (name, pid), = pooled().items()
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: name not in pooled() and len(pooled()) == 1, "a new pooled QEMU",
          timeout=120)  # fmt: skip
    assert _exits(node, "warm_pool") == exits0 + 1
    _no_ghost_no_leak(instance)
    sbx = Sandbox.create("base", timeout=TTL_S)  # the new pooled VM serves
    try:
        assert sbx.commands.run("echo ok").stdout == "ok\n"
    finally:
        sbx.kill()
