"""Pause/resume, snapshots and fork on real microVMs, at the runtime level."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aenv.machines.api import AgentInit
from tests.support import envd_client
from tests.support.counter import counting

pytestmark = pytest.mark.vm

COUNTER = "nohup sh -c '" + counting("/tmp/counter", 0.2) + "' >/dev/null 2>&1 &"
COUNTING = "; until [ -s /tmp/counter ]; do sleep 0.1; done"  # not a fixed sleep: a busy host


async def _counter_passes(h, value: int, token: str) -> int:  # type: ignore[no-untyped-def]
    for _ in range(600):
        now = int(await _run(h, "cat /tmp/counter", token))
        if now > value:
            return now
        await asyncio.sleep(0.1)
    raise AssertionError(f"the counter process did not continue past {value}")


async def _run(handle, cmd: str, token: str | None = None) -> str:
    code, out, err = await asyncio.to_thread(envd_client.run, handle.url(), cmd, token)
    assert code == 0, (cmd, out, err)
    return out


async def test_pause_resume_keeps_processes_memory_and_files(runtime, sandbox_id):
    h = await runtime.create(sandbox_id, "base", AgentInit(access_token="t1"))
    try:
        await _run(h, COUNTER + " echo data > /home/user/kept" + COUNTING, "t1")
        before = int(await _run(h, "cat /tmp/counter", "t1"))
        assert before > 0
        pid = h.vmm_pid
        slot = runtime.machines()[sandbox_id].slot
        # Hot: the stopped VMM and its slot are kept, and continued by the resume.
        await runtime.pause(sandbox_id)
        assert runtime.is_paused(sandbox_id) and runtime.tier(sandbox_id) == "hot"
        assert Path(f"/proc/{pid}").exists() and runtime.slots.holds(slot)
        h = await runtime.resume(sandbox_id, AgentInit(access_token="t2"))
        assert h.vmm_pid == pid and h.ready is not None
        await h.ready  # the data plane waits for it: here the test does
        assert await _run(h, "cat /home/user/kept", "t2") == "data\n"
        after = await _counter_passes(h, before, "t2")
        # Cold: the hot VMM demoted, its state on disk restored into a new one.
        await runtime.pause(sandbox_id)
        assert await runtime.hot.demote(sandbox_id, "test")
        assert runtime.tier(sandbox_id) == "cold"
        assert not Path(f"/proc/{pid}").exists(), "a cold paused sandbox still has a VMM"
        assert not runtime.slots.holds(slot), "a cold paused sandbox still holds a slot"
        h = await runtime.resume(sandbox_id, AgentInit(access_token="t3"))
        after = await _counter_passes(h, after, "t3")
        # pause/resume again: cost does not depend on history
        await runtime.pause(sandbox_id)
        await runtime.hot.demote(sandbox_id, "test")
        h = await runtime.resume(sandbox_id, AgentInit(access_token="t4"))
        assert int(await _run(h, "cat /tmp/counter", "t4")) >= after
    finally:
        await runtime.destroy(sandbox_id)
    assert not (runtime.cfg.sandboxes_dir / sandbox_id).exists()


async def test_fork_children_share_parent_state_then_diverge(runtime, sandbox_id):
    h = await runtime.create(sandbox_id, "base", AgentInit())
    kids = [f"{sandbox_id}k{i}" for i in range(4)]
    try:
        await _run(h, COUNTER + " echo parent > /home/user/p" + COUNTING)
        results = await runtime.fork(sandbox_id, [(k, AgentInit(env_vars={"KID": k}))
                                                  for k in kids])
        assert all(not isinstance(r, BaseException) for r in results), results
        # Children take their /init behind the call; the data plane waits for it.
        await asyncio.gather(*(r.ready for r in results if r.ready is not None))
        outs = []
        for k, child in zip(kids, results, strict=True):
            assert child.sandbox_id == k
            out = await _run(child, "cat /home/user/p; echo $KID; "
                                    "test -s /tmp/counter && echo counting; "
                                    "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; "
                                    f"echo {k} > /home/user/mine")
            lines = out.splitlines()
            assert lines[:3] == ["parent", k, "counting"]
            outs.append(lines[3])
        assert len(set(outs)) == len(kids), "fork children share RNG output"
        # each child only sees its own write
        for k, child in zip(kids, results, strict=True):
            assert (await _run(child, "cat /home/user/mine")).strip() == k
        # the source kept running and sees none of the children's writes
        assert "missing" in await _run(h, "cat /home/user/mine 2>/dev/null || echo missing")
        assert not any(s.startswith("fork-") for s in runtime.snapshots.list())
    finally:
        for k in kids:
            await runtime.destroy(k)
        await runtime.destroy(sandbox_id)


async def test_create_from_named_snapshot_starts_at_that_state(runtime, sandbox_id):
    h = await runtime.create(sandbox_id, "base", AgentInit())
    snap = "snap-test-" + sandbox_id
    try:
        await _run(h, "echo step10 > /home/user/state")
        man = await runtime.snapshot_sandbox(sandbox_id, snap, ["step10"])
        assert man.parent == sandbox_id
        await _run(h, "echo later > /home/user/state")
        c = await runtime.create(sandbox_id + "c", snap, AgentInit())
        assert (await _run(c, "cat /home/user/state")).strip() == "step10"
        await runtime.destroy(c.sandbox_id)
    finally:
        await runtime.destroy(sandbox_id)
        runtime.delete_snapshot(snap)
    assert snap not in runtime.snapshots.list()
