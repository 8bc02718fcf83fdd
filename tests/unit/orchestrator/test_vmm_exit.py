"""A sandbox whose VMM exits on its own is removed as a kill removes it (reason
`vmm_exited`), once, whatever operation is in flight on it; and the pidfd an adopted VMM's
launcher is watched through serves several waiters at once.

The orchestrator runs over the fake runtime: `FakeRuntime.vmm_exit` reports a death the way
the QEMU runtime's watcher does (tests/e2e/test_vmm_exit.py kills real QEMUs)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import pytest

from aenv.machines.api import SandboxHandle, VmmExit
from aenv.obs import OPS_TOTAL
from aenv.orchestrator.errors import NotFound
from aenv.orchestrator.fake import FakeRuntime
from aenv.orchestrator.service import CreateRequest, Orchestrator
from aenv.orchestrator.states import PUBLIC_STATE, SandboxState
from aenv.orchestrator.store import ListQuery
from aenv.vmm.cgroup import Cgroup, Limits
from aenv.vmm.jail import UNKNOWN_STATUS, AdoptedProcess, start_time, vmm_returncode

S = SandboxState


def req() -> CreateRequest:
    return CreateRequest(template="base", timeout_s=300)


class Stream:
    aborted = False

    def abort(self) -> None:
        self.aborted = True


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def settled(orch: Orchestrator) -> None:
    """Every removal the exit reports started has finished."""
    await until(lambda: not orch._reaping)


def gated(fn: Callable[..., Awaitable[object]], gate: asyncio.Event, *, before: bool = True
          ) -> Callable[..., Awaitable[object]]:  # fmt: skip
    """`fn` that waits for `gate` before (or after) it runs."""

    async def wrapper(*a: object, **kw: object) -> object:
        if before:
            await gate.wait()
        out = await fn(*a, **kw)
        if not before:
            await gate.wait()
        return out

    return wrapper


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_dead_vmm_removes_its_sandbox_like_a_kill(
    orch: Orchestrator, runtime: FakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "aenv")
    a, b = await orch.create(req()), await orch.create(req())
    route = orch.routes.get(a.sandbox_id)
    assert route is not None
    stream = Stream()
    route.streams.add(stream)
    before = OPS_TOTAL.labels("kill", "vmm_exited")._value.get()
    runtime.vmm_exit(a.sandbox_id, VmmExit(signal="SIGKILL"))
    await until(lambda: orch.store.get(a.sandbox_id) is None)
    await settled(orch)
    assert stream.aborted and orch.routes.get(a.sandbox_id) is None
    with pytest.raises(NotFound):
        orch.get(a.sandbox_id)
    listed, _ = orch.list(ListQuery(states=frozenset(PUBLIC_STATE)))
    assert [r.sandbox_id for r in listed] == [b.sandbox_id]
    assert runtime.killed == [a.sandbox_id] and a.sandbox_id not in runtime.exited
    assert OPS_TOTAL.labels("kill", "vmm_exited")._value.get() == before + 1
    killed = [r.kv for r in caplog.records if r.getMessage() == "sandbox.killed"]  # type: ignore[attr-defined]
    assert len(killed) == 1 and killed[0]["reason"] == "vmm_exited"
    assert killed[0]["signal"] == "SIGKILL"
    assert orch.get(b.sandbox_id).state is S.RUNNING and runtime.is_running(b.sandbox_id)
    assert not errors(caplog)


async def test_exit_during_a_kill_in_flight_is_one_removal(
    orch: Orchestrator, runtime: FakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    rec = await orch.create(req())
    calls: list[str] = []
    gate = asyncio.Event()
    real_kill = runtime.kill

    async def kill(handle: SandboxHandle) -> None:
        calls.append(handle.sandbox_id)
        await real_kill(handle)

    runtime.kill = gated(kill, gate)  # type: ignore[method-assign]
    killing = asyncio.create_task(orch.kill(rec.sandbox_id))
    await until(lambda: orch.store.get(rec.sandbox_id).state is S.KILLING)
    runtime.vmm_exit(rec.sandbox_id)  # it crashes on its own meanwhile
    await asyncio.sleep(0.3)  # the removal waits for the kill (the lock is held)
    gate.set()
    assert await killing is None
    await settled(orch)
    assert calls == [rec.sandbox_id] and runtime.killed == [rec.sandbox_id]
    assert orch.store.all() == [] and len(orch.routes) == 0
    assert not errors(caplog)


async def test_kill_request_during_a_removal_joins_it(
    orch: Orchestrator, runtime: FakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    rec = await orch.create(req())
    gate = asyncio.Event()
    runtime.kill = gated(runtime.kill, gate)  # type: ignore[method-assign]
    runtime.vmm_exit(rec.sandbox_id)
    await until(lambda: orch.store.get(rec.sandbox_id).state is S.KILLING)
    killing = asyncio.create_task(orch.kill(rec.sandbox_id))  # the user's DELETE
    await asyncio.sleep(0.05)
    gate.set()
    await killing  # no 404: it joined the removal
    await settled(orch)
    assert runtime.killed == [rec.sandbox_id] and orch.store.all() == []
    assert not errors(caplog)


async def test_exit_after_a_pause_saved_its_state_leaves_it_paused(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    """The VMM died between the save and the node ending it: the pause wins, the sandbox
    stays paused and resumes."""
    rec = await orch.create(req())
    gate = asyncio.Event()
    runtime.pause = gated(runtime.pause, gate, before=False)  # type: ignore[method-assign]
    pausing = asyncio.create_task(orch.pause(rec.sandbox_id))
    await until(lambda: rec.sandbox_id in runtime.paused)
    orch._vmm_exited(rec.sandbox_id, VmmExit(exit_code=0))  # the report, late
    await asyncio.sleep(0.3)
    gate.set()
    await pausing
    await settled(orch)
    assert orch.get(rec.sandbox_id).state is S.PAUSED and runtime.killed == []
    resumed = await orch.resume(rec.sandbox_id, 300)
    assert resumed.state is S.RUNNING


async def test_exit_before_a_pause_saved_makes_the_pause_fail_and_remove_it(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    rec = await orch.create(req())
    gate = asyncio.Event()
    runtime.pause = gated(runtime.pause, gate)  # type: ignore[method-assign]
    pausing = asyncio.create_task(orch.pause(rec.sandbox_id))
    await until(lambda: orch.store.get(rec.sandbox_id).state is S.PAUSING)
    runtime.vmm_exit(rec.sandbox_id)
    await asyncio.sleep(0.3)
    assert orch.store.get(rec.sandbox_id).state is S.PAUSING  # the pause decides
    gate.set()
    with pytest.raises(Exception, match="exited"):
        await pausing
    await settled(orch)
    assert orch.store.all() == [] and runtime.killed == [rec.sandbox_id]


async def test_a_fork_child_that_dies_while_creating_is_removed_once_running(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    """A fork child's record is Creating (its own lock free) until every child is up: the
    removal waits for it to become Running."""
    src = await orch.create(req())
    gate = asyncio.Event()
    runtime.fork = gated(runtime.fork, gate, before=False)  # type: ignore[method-assign]
    forking = asyncio.create_task(orch.fork(src.sandbox_id, 1))
    await until(lambda: len(runtime.live) == 2)
    child = next(s for s in runtime.live if s != src.sandbox_id)
    runtime.vmm_exit(child)
    await asyncio.sleep(0.3)
    assert orch.store.get(child).state is S.CREATING
    gate.set()
    await forking
    await until(lambda: orch.store.get(child) is None)
    await settled(orch)
    assert runtime.killed == [child] and orch.get(src.sandbox_id).state is S.RUNNING


async def test_a_report_for_a_sandbox_running_a_new_vm_does_nothing(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    rec = await orch.create(req())
    orch._vmm_exited(rec.sandbox_id, VmmExit())  # e.g. a late report of an earlier VMM
    await settled(orch)
    assert orch.get(rec.sandbox_id).state is S.RUNNING and runtime.killed == []


async def test_adopted_process_serves_concurrent_waiters() -> None:
    """The exit watcher and a kill both wait on an adopted launcher's pidfd (one reader on
    the loop, shared by every waiter), and polling `returncode` meanwhile breaks neither."""
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        started = start_time(child.pid)
        assert started is not None
        proc = AdoptedProcess.attach(child.pid, started)
        assert proc is not None
        waiters = [asyncio.create_task(proc.wait()) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert proc.returncode is None and not any(w.done() for w in waiters)
        proc.kill()
        child.wait()  # without yielding to the loop: its reader has not run yet
        assert proc.returncode == UNKNOWN_STATUS  # this closes the fd (and resolves waiters)
        assert await asyncio.wait_for(asyncio.gather(*waiters), 5) == [UNKNOWN_STATUS] * 3
        assert await proc.wait() == UNKNOWN_STATUS
    finally:
        child.kill()
        child.wait()


def test_the_vmm_status_from_its_launchers() -> None:
    """unshare passes on the VMM's exit code and (re-raising it) its signal, except SIGKILL:
    util-linux 2.38 then exits 1 and says why on the VMM's log."""
    assert vmm_returncode(0, "") == 0
    assert vmm_returncode(-signal.SIGSEGV, "") == -signal.SIGSEGV
    assert vmm_returncode(1, "qemu-system-x86_64: -drive ...: Could not open") == 1
    lost = "x\nunshare: sigprocmask unblock failed: Invalid argument\n"
    assert vmm_returncode(1, lost) == -signal.SIGKILL


def test_a_cgroup_counts_its_oom_kills() -> None:
    if os.geteuid() != 0:
        pytest.skip("cgroups need root")
    cg = Cgroup(f"vmmexit-oom-{os.getpid()}")
    cg.create(Limits(memory_bytes=64 << 20, pids=16, cpus=1.0))
    try:
        assert cg.oom_kills() == 0
        hog = subprocess.run([sys.executable, "-c", "b = bytearray(512 << 20)"],
                             preexec_fn=cg.enter_self, capture_output=True)  # fmt: skip
        assert hog.returncode == -signal.SIGKILL, hog.stderr
        assert cg.oom_kills() == 1
    finally:
        cg.remove()
