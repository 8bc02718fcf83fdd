"""kill -9 of the node while sandboxes run: the next node process of the same instance
re-adopts their QEMUs (same processes, same slots, same tokens), and reclaims everything
else: a VM that died while no node ran, and the old warm pool. Once the last node process
stopped, the `instance` fixture (conftest) checks the instance's leak census: no QEMU,
netns, cgroup or directory of it is left."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxState
from e2b.exceptions import FileNotFoundException

from aenv.vmm.cgroup import list_groups
from tests.support.counter import counting

from .conftest import (
    DATA_DIR,
    NodeProcess,
    free_port,
    qemu_pids,
    start_node,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

WARM_POOL_SIZE = 2  # the default; the test sets it so the bound below holds
COUNTER = counting("/tmp/count", 0.2)


def _start(tmp_path: Path, label: str, instance: str, port: int,
           monkeypatch: pytest.MonkeyPatch, **env: str) -> NodeProcess:
    return start_node(tmp_path / f"{label}.log", instance, monkeypatch, port,
                      AENV_WARM_POOL_SIZE=str(WARM_POOL_SIZE), **env)


def _vm_dir(instance: str, sandbox_id: str) -> Path:
    """The sandbox's real VM directory (a warm-restored one's is the pooled VM's)."""
    return (DATA_DIR / "sandboxes" / instance / sandbox_id).resolve()


def _vmm_pid(vm_dir: Path) -> int | None:
    marker = f"{vm_dir}/".encode()
    for pid in qemu_pids():
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def _count(s: Sandbox) -> int:
    try:
        return int(s.files.read("/tmp/count").strip() or 0)
    except FileNotFoundException:  # not written yet
        return 0


def _wait(cond: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_kill_9_then_restart_readopts_running_sandboxes(
    tmp_path: Path, instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()  # the restarted node takes the same port: the SDK objects live on
    a = _start(tmp_path, "a", instance, port, monkeypatch)
    b: NodeProcess | None = None
    try:
        try:
            s1, s2, s3 = (Sandbox.create(timeout=600) for _ in range(3))
            counter = s1.commands.run(COUNTER, background=True, timeout=0)
            s1.commands.run("until [ -s /tmp/count ]; do sleep 0.1; done")  # it has started
            s1.files.write("f.txt", "one")
            s2.files.write("f.txt", "two")
            _wait(lambda: _count(s1) >= 3, "the counter")
            dirs = {s.sandbox_id: _vm_dir(instance, s.sandbox_id) for s in (s1, s2, s3)}
            vmm = {sid: _vmm_pid(d) for sid, d in dirs.items()}
            assert all(vmm.values()), vmm
            old_pool = qemu_pids(instance) - set(vmm.values())
            count_at_kill = _count(s1)
        finally:
            a.kill9()
        assert set(vmm.values()) <= qemu_pids(instance), "a VMM died with the node"
        # A VM that dies while no node runs is not adopted.
        os.kill(vmm[s3.sandbox_id], signal.SIGKILL)  # type: ignore[arg-type]
        _wait(lambda: vmm[s3.sandbox_id] not in qemu_pids(instance), "s3's VMM to end")

        b = _start(tmp_path, "b", instance, port, monkeypatch)
        listed = {s.sandbox_id: s.state for s in Sandbox.list().next_items()}
        assert listed == {s1.sandbox_id: SandboxState.RUNNING,
                          s2.sandbox_id: SandboxState.RUNNING}, b.tail()
        done = [ln for ln in b.tail(400).splitlines() if "recovery.done" in ln]
        print("\n".join(done))
        assert done and "adopted=2" in done[-1], done
        # The same QEMU processes; the dead one's directory and jail are gone; of the old
        # warm pool nothing runs, only the new pool beside the adopted VMs.
        for s in (s1, s2):
            assert _vmm_pid(dirs[s.sandbox_id]) == vmm[s.sandbox_id]
        assert not dirs[s3.sandbox_id].exists()
        assert f"{instance}-{dirs[s3.sandbox_id].name}" not in list_groups()
        running = qemu_pids(instance)
        assert not running & old_pool, f"old warm-pool VMMs still run: {running & old_pool}"
        assert len(running - {vmm[s1.sandbox_id], vmm[s2.sandbox_id]}) <= WARM_POOL_SIZE

        # Through the proxy, with the SDK objects (URL, envdAccessToken) from before.
        assert s1.files.read("f.txt") == "one"
        assert s2.commands.run("cat f.txt").stdout == "two"
        # The background process kept counting: the same process, never restarted.
        assert _count(s1) > count_at_kill, "the counter restarted"
        assert counter.pid in [p.pid for p in s1.commands.list()]

        # An adopted sandbox pauses (hot: its stopped VMM is kept) and resumes (continued).
        assert s2.pause() is True
        with b.api() as c:
            assert c.get(f"/sandboxes/{s2.sandbox_id}").json()["pauseTier"] == "hot"
        assert vmm[s2.sandbox_id] in qemu_pids(instance)
        r2 = Sandbox.connect(s2.sandbox_id)
        assert r2.files.read("f.txt") == "two"
        assert _vmm_pid(dirs[s2.sandbox_id]) == vmm[s2.sandbox_id]

        # Killing an adopted sandbox ends its VMM and removes its jail and directory.
        s1.kill()
        assert vmm[s1.sandbox_id] not in qemu_pids(instance)
        assert not dirs[s1.sandbox_id].exists()
        assert not (DATA_DIR / "sandboxes" / instance / s1.sandbox_id).exists()
        assert f"{instance}-{dirs[s1.sandbox_id].name}" not in list_groups()
        r2.kill()
    finally:
        if b is None:  # failed before the restart: a node still ends what a left
            b = _start(tmp_path, "b", instance, port, monkeypatch)
        code = b.stop()
    assert code == 0, b.tail()
    log = b.log.read_text(errors="replace")
    assert not re.search(r"kill_failed|reclaim_failed|adopt_failed", log), b.tail(200)


@pytest.mark.parametrize("point", ["save.after_stop", "pause.after_save"])
def test_a_guest_left_stopped_by_a_crashed_pause_is_adopted_and_continues(
    tmp_path: Path, instance: str, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    # The node dies inside the pause with the guest's vCPUs stopped (record Pausing, no
    # manifest): the restarted node re-adopts the VM and lets it continue.
    port = free_port()
    a = _start(tmp_path, "a", instance, port, monkeypatch, AENV_FAULTS=f"{point}=exit")
    b: NodeProcess | None = None
    try:
        try:
            s = Sandbox.create(timeout=600)
            counter = s.commands.run(COUNTER, background=True, timeout=0)
            s.commands.run("until [ -s /tmp/count ]; do sleep 0.1; done")  # it has started
            _wait(lambda: _count(s) >= 3, "the counter")
            vmm = _vmm_pid(_vm_dir(instance, s.sandbox_id))
            with pytest.raises(Exception):  # noqa: B017 (the node dies under the call)
                s.pause()
            assert a.proc is not None and a.proc.wait(30) == 137, a.tail()
        finally:
            a.kill9()
        b = _start(tmp_path, "b", instance, port, monkeypatch)
        listed = {x.sandbox_id: x.state for x in Sandbox.list().next_items()}
        assert listed == {s.sandbox_id: SandboxState.RUNNING}, b.tail()
        assert _vmm_pid(_vm_dir(instance, s.sandbox_id)) == vmm
        n = _count(s)
        _wait(lambda: _count(s) > n, "the counter to go on")
        assert counter.pid in [p.pid for p in s.commands.list()]
        s.kill()
    finally:
        if b is None:
            b = _start(tmp_path, "b", instance, port, monkeypatch)
        code = b.stop()
    assert code == 0, b.tail()
