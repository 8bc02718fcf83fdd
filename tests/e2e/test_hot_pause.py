"""The hot pause tier (machines/hot.py) with real VMs and the unmodified SDK: a pause
keeps the stopped VMM, a resume continues it; hot becomes cold by age, beyond the hot budget,
when a create needs the memory, when its VMM dies, at shutdown and across a kill -9 of the
node. Processes, memory and files survive every path, and nothing is left behind."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxState

from aenv.vmm import memory
from tests.support.counter import counting
from tests.support.host import qemu_pids, vmm_of

from .conftest import NodeProcess, running_node, start_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# A process that counts in RAM (tmpfs) every 0.1 s: alive and counting on = memory intact.
COUNTER = "sh -c '" + counting("/dev/shm/n", 0.1) + "'"


def _wait(cond: Callable[[], object], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.2)


def _tier(node: NodeProcess, sid: str) -> str | None:
    with node.api() as c:
        return c.get(f"/sandboxes/{sid}").json().get("pauseTier")


def _demotions(node: NodeProcess) -> dict[str, float]:
    with node.api() as c:
        text = c.get("/metrics").text
    return {m[1]: float(m[2]) for m in
            re.finditer(r'^aenv_hot_demotions_total\{reason="(\w+)"\} ([\d.]+)', text, re.M)}


def _start_counter(sbx: Sandbox) -> int:
    sbx.commands.run(COUNTER, background=True, timeout=0)
    _wait(lambda: sbx.commands.run("cat /dev/shm/n 2>/dev/null || true").stdout.strip(),
          "the counter to start")  # fmt: skip
    return int(sbx.commands.run("cat /dev/shm/n").stdout)


def _counter_goes_on(sbx: Sandbox, before: int) -> None:
    """The counting process survived (its count carries on from before the pause)."""
    first = int(sbx.commands.run("cat /dev/shm/n").stdout)
    assert first >= before
    _wait(lambda: int(sbx.commands.run("cat /dev/shm/n").stdout) > first, "the count to go on")


def _clock_ok(sbx: Sandbox) -> None:
    """The guest's clock is within 1 s of the host's: its reading falls in the interval the
    command ran in, widened by 1 s (a busy host may take seconds to run the command)."""
    before = time.time()
    guest = float(sbx.commands.run("date +%s.%N").stdout)
    after = time.time()
    assert before - 1.0 <= guest <= after + 1.0, f"guest clock {guest}, host {before}..{after}"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    # One hot VMM at most, aged out after 6 s, its RAM released at once.
    with running_node(tmp_path_factory.mktemp("node"), AENV_HOT_PAUSE_MAX="1",
                      AENV_HOT_PAUSE_S="6", AENV_HOT_RELEASE_DELAY_S="0",
                      AENV_MEMORY_BUDGET_MIB="1050", AENV_PRIMED_POOL_SIZE="0") as n:
        yield n


def test_a_hot_pause_keeps_the_vmm_stopped_and_the_resume_continues_it(
        node: NodeProcess) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write("/home/user/kept.txt", "kept")
        n = _start_counter(sbx)
        running = vmm_of(node.env["AENV_INSTANCE"], sbx.sandbox_id)
        assert running is not None
        rss_running = memory.mapping_rss(running)
        assert sbx.pause() is True
        assert _tier(node, sbx.sandbox_id) == "hot"
        vmm = vmm_of(node.env["AENV_INSTANCE"], sbx.sandbox_id)
        assert vmm is not None and vmm.pid == running.pid, "a hot pause keeps the same VMM"
        # Released at once (delay 0): the guest RAM left the process; no vCPU time is used.
        _wait(lambda: memory.mapping_rss(vmm) <= rss_running // 20, "the RAM to be released")
        ticks = Path(f"/proc/{vmm.pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]
        time.sleep(2)
        after = Path(f"/proc/{vmm.pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13]
        assert sum(map(int, after)) - sum(map(int, ticks)) <= 2, "a stopped VMM ran"
        assert sbx.get_info().state == SandboxState.PAUSED
        same = Sandbox.connect(sbx.sandbox_id)
        assert vmm_of(node.env["AENV_INSTANCE"], sbx.sandbox_id).pid == running.pid
        _counter_goes_on(same, n)
        _clock_ok(same)
        assert same.files.read("/home/user/kept.txt") == "kept"
        assert _tier(node, sbx.sandbox_id) is None
    finally:
        sbx.kill()
    _wait(lambda: vmm_of(node.env["AENV_INSTANCE"], sbx.sandbox_id) is None, "the VMM to end")


@pytest.fixture
def tight_node(tmp_path: Path):  # type: ignore[no-untyped-def]
    # As `node`, with a memory budget that holds a hot VMM (~100 MiB resident: QEMU's own)
    # beside a new 512 MiB sandbox, but not also a running one (~100 MiB held, measured).
    with running_node(tmp_path, AENV_HOT_PAUSE_MAX="1", AENV_HOT_PAUSE_S="6",
                      AENV_HOT_RELEASE_DELAY_S="0", AENV_MEMORY_BUDGET_MIB="650",
                      AENV_PRIMED_POOL_SIZE="0") as n:  # fmt: skip
        yield n


def test_hot_becomes_cold_by_budget_by_memory_and_by_age(tight_node: NodeProcess) -> None:
    node = tight_node
    a = Sandbox.create(timeout=300)
    b = Sandbox.create(timeout=300)
    c = None
    try:
        na = _start_counter(a)
        a.files.write("/home/user/a.txt", "a")
        before = _demotions(node)
        assert a.pause() and b.pause()
        # The hot budget holds one: pausing b made a cold (its VMM ended, its state on disk).
        assert (_tier(node, a.sandbox_id), _tier(node, b.sandbox_id)) == ("cold", "hot")
        assert vmm_of(node.env["AENV_INSTANCE"], a.sandbox_id) is None
        assert _demotions(node).get("budget", 0) == before.get("budget", 0) + 1
        a2 = Sandbox.connect(a.sandbox_id)  # a cold resume: the memory state restored
        _counter_goes_on(a2, na)
        _clock_ok(a2)
        assert a2.files.read("/home/user/a.txt") == "a"
        # a (~100 MiB held) + a new one (512 MiB) + hot b (~100 MiB resident) > 650 MiB.
        c = Sandbox.create(timeout=300)
        assert _tier(node, b.sandbox_id) == "cold"
        assert _demotions(node).get("memory", 0) == before.get("memory", 0) + 1
        assert c.pause()
        assert _tier(node, c.sandbox_id) == "hot"
        _wait(lambda: _tier(node, c.sandbox_id) == "cold", "the age limit (6 s)", 15)
        assert _demotions(node).get("age", 0) >= before.get("age", 0) + 1
        Sandbox.connect(b.sandbox_id)
        assert Sandbox.connect(c.sandbox_id).commands.run("echo ok").stdout.strip() == "ok"
    finally:
        for s in (a, b, c):
            if s is not None:
                s.kill()


def test_a_hot_vmm_killed_by_hand_leaves_its_sandbox_paused_cold(node: NodeProcess) -> None:
    sbx = Sandbox.create(timeout=300)
    try:
        n = _start_counter(sbx)
        assert sbx.pause() is True
        vmm = vmm_of(node.env["AENV_INSTANCE"], sbx.sandbox_id)
        assert vmm is not None
        os.kill(vmm.pid, signal.SIGKILL)
        _wait(lambda: _tier(node, sbx.sandbox_id) == "cold", "the tier to become cold")
        assert sbx.get_info().state == SandboxState.PAUSED
        same = Sandbox.connect(sbx.sandbox_id)
        _counter_goes_on(same, n)
    finally:
        sbx.kill()


@pytest.mark.long  # ~25 s
def test_kill_9_of_the_node_and_a_shutdown_leave_hot_sandboxes_resumable_cold(
    tmp_path: Path, instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = start_node(tmp_path / "a.log", instance, monkeypatch)
    try:
        s1 = Sandbox.create(timeout=300)
        n1 = _start_counter(s1)
        assert s1.pause() is True
        assert _tier(a, s1.sandbox_id) == "hot"
        hot = vmm_of(instance, s1.sandbox_id)
        assert hot is not None
    finally:
        a.kill9()
    assert hot.pid in qemu_pids(instance), "the hot VMM outlives its node"
    b = start_node(tmp_path / "b.log", instance, monkeypatch)
    try:
        # Reclaimed at start: the next node does not adopt a VMM that was not running.
        assert hot.pid not in qemu_pids(instance)
        assert _tier(b, s1.sandbox_id) == "cold"
        r1 = Sandbox.connect(s1.sandbox_id)
        _counter_goes_on(r1, n1)
        _clock_ok(r1)
        n1 = int(r1.commands.run("cat /dev/shm/n").stdout)
        assert r1.pause() is True
        assert _tier(b, s1.sandbox_id) == "hot"
    finally:
        assert b.stop() == 0, b.tail()  # SIGTERM: hot becomes cold, no VMM stays
    assert not qemu_pids(instance), "a hot VMM outlived the node's shutdown"
    c = start_node(tmp_path / "c.log", instance, monkeypatch)
    try:
        r1 = Sandbox.connect(s1.sandbox_id)
        _counter_goes_on(r1, n1)
        r1.kill()
    finally:
        assert c.stop() == 0, c.tail()


def _children_are_their_own(kids: list[Sandbox]) -> None:
    """Each child answers, with its own entropy, and a clock within 1 s of the host's."""
    seen = set()
    for k in kids:
        seen.add(k.commands.run("head -c 16 /dev/urandom | od -An -tx1").stdout)
        _clock_ok(k)
    assert len(seen) == len(kids), "two children share their entropy"


@pytest.mark.long  # ~45 s (forks from each state: integration/vmm/test_snapshots.py)
def test_forks_from_running_hot_cold_and_a_named_snapshot(node: NodeProcess) -> None:
    src = Sandbox.create(timeout=300)
    other = Sandbox.create(timeout=300)
    kids: list[Sandbox] = []
    snap = None
    try:
        src.files.write("/home/user/src.txt", "from the source")
        for state in ("running", "hot", "cold"):
            if state == "hot":
                assert src.pause() is True
            elif state == "cold":
                assert other.pause() is True  # the hot budget holds one: src goes cold
            assert _tier(node, src.sandbox_id) == (None if state == "running" else state)
            out = src.fork(count=2, timeout=120)
            assert all(isinstance(k, Sandbox) for k in out), out
            kids += out  # type: ignore[arg-type]
            for k in out:
                assert k.files.read("/home/user/src.txt") == "from the source"  # type: ignore[union-attr]
            assert src.get_info().state == (
                SandboxState.RUNNING if state == "running" else SandboxState.PAUSED)
        _children_are_their_own(kids)
        for k in kids:
            k.kill()
        # 16 children of a named snapshot at once (aenv's POST /snapshots/{id}/fork).
        src = Sandbox.connect(src.sandbox_id)
        snap = src.create_snapshot().snapshot_id
        with node.api() as c:
            r = c.post(f"/snapshots/{snap}/fork", json={"count": 16, "timeout": 120})
        assert r.status_code == 201, r.text
        ids = [o["sandbox"]["sandboxID"] for o in r.json() if "sandbox" in o]
        assert len(ids) == 16, r.text
        kids = [Sandbox.connect(i) for i in ids]
        _children_are_their_own(kids)
    finally:
        for k in kids:
            k.kill()
        src.kill()
        other.kill()
        if snap is not None:
            Sandbox.delete_snapshot(snap)


def _primed_snapshots(node: NodeProcess) -> float:
    with node.api() as c:
        text = c.get("/metrics").text
    m = re.search(r'^aenv_pooled_vms\{kind="primed_snapshot"\} ([\d.]+)', text, re.M)
    return float(m[1]) if m else 0.0


def test_a_snapshot_served_by_a_primed_vm_keeps_its_own_identity(node: NodeProcess) -> None:
    src = Sandbox.create(timeout=300)
    made: list[Sandbox] = []
    snap = None
    try:
        src.files.write("/home/user/task.txt", "task 7")
        snap = src.create_snapshot().snapshot_id
        made.append(Sandbox.create(snap, timeout=120))  # the pool now follows this snapshot
        _wait(lambda: _primed_snapshots(node) >= 1, "a VM primed from the snapshot", 60)
        made.append(Sandbox.create(snap, timeout=120))  # ... served by it
        served = f"create {made[1].sandbox_id}: primed VM "  # the runtime's debug line
        assert served in node.log.read_text(errors="replace"), "no primed VM served it"
        with node.api() as c:
            tokens = {c.get(f"/sandboxes/{s.sandbox_id}").json()["envdAccessToken"]
                      for s in [src, *made]}  # fmt: skip
        assert len(tokens) == 3, "a primed VM kept another sandbox's token"
        for s in made:
            assert s.files.read("/home/user/task.txt") == "task 7"
        _children_are_their_own(made)
    finally:
        for s in made:
            s.kill()
        src.kill()
        if snap is not None:
            Sandbox.delete_snapshot(snap)
