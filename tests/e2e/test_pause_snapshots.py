"""Pause, resume, snapshots, fork, auto-pause/resume with the unmodified `e2b` SDK on real VMs:
e2b-compat.md section 12 item 8, checklist items 17, 18 and the fork/snapshot calls of 21.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2b import AsyncSandbox, Sandbox, SandboxQuery, SandboxState, TimeoutException
from e2b.exceptions import SandboxNotFoundException

from tests.support.counter import counting

from .conftest import NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

# A process with memory: one tick a second (light enough for many VMs on a TCG host).
COUNTER = counting("/tmp/counter", 1)
RANDOM = "head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'"


def _counter(sbx: Sandbox) -> int:
    return int(sbx.commands.run("cat /tmp/counter").stdout)


def _until(cond, timeout: float = 120.0, step: float = 0.1):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(step)


def test_sync_pause_and_connect_keep_processes_memory_and_files(node: NodeProcess) -> None:
    suite = str(uuid.uuid4())
    sbx = Sandbox.create(timeout=120, metadata={"suite": suite}, envs={"FOO": "bar"})
    try:
        # section 12 item 8: a background process and a file, then pause
        bg = sbx.commands.run("sleep 300", background=True, timeout=0)
        sbx.commands.run(COUNTER, background=True, timeout=0)
        sbx.commands.run("until [ -s /tmp/counter ]; do sleep 0.1; done")  # it has started
        sbx.files.write("kept.txt", "survives pause")
        _until(lambda: sbx.files.exists("/tmp/counter"))
        before = _counter(sbx)
        t_before = time.monotonic()

        assert sbx.beta_pause() is True
        assert sbx.pause() is False  # already paused: 409
        assert not sbx.is_running()  # data plane: 502 "was not found"
        with pytest.raises(TimeoutException):  # SandboxNotRunningException
            sbx.files.read("kept.txt")
        info = sbx.get_info()
        assert info.state == SandboxState.PAUSED and info.metadata == {"suite": suite}
        q = SandboxQuery(metadata={"suite": suite}, state=[SandboxState.PAUSED])
        assert [s.sandbox_id for s in Sandbox.list(query=q).next_items()] == [sbx.sandbox_id]
        running = SandboxQuery(metadata={"suite": suite}, state=[SandboxState.RUNNING])
        assert Sandbox.list(query=running).next_items() == []
        paused_s = 3.0
        time.sleep(paused_s)  # a paused guest does not run

        same = Sandbox.connect(sbx.sandbox_id)  # resumes: 201, the same token
        assert same.sandbox_id == sbx.sandbox_id and same.is_running()
        assert same.files.read("kept.txt") == "survives pause"
        assert bg.pid in [p.pid for p in same.commands.list()]
        assert same.commands.run("echo back $FOO").stdout == "back bar\n"
        after = _counter(same)
        # The same process, with its memory: it went on from `before` (a restarted one would
        # count from 0) and did not count through the pause (5 ticks a second).
        ran_s = time.monotonic() - t_before - paused_s
        assert before <= after <= before + ran_s + 2, (before, after, ran_s)
        _until(lambda: _counter(same) > after, timeout=30)  # and it goes on
        # the old object still works: same id, same token
        assert sbx.commands.run("echo old").stdout == "old\n"
        assert sbx.get_info().state == SandboxState.RUNNING
        # connect on a running sandbox: 200, extend-only
        end = sbx.get_info().end_at
        Sandbox.connect(sbx.sandbox_id, timeout=5)
        assert sbx.get_info().end_at == end

        # kill of a paused sandbox
        assert sbx.pause() is True
        assert sbx.kill() is True
        assert Sandbox.kill(sbx.sandbox_id) is False
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(sbx.sandbox_id)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.pause(sbx.sandbox_id)
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_async_pause_and_connect(node: NodeProcess) -> None:
    async def scenario() -> None:
        sbx = await AsyncSandbox.create(timeout=120, envs={"FOO": "async"})
        try:
            bg = await sbx.commands.run("sleep 300", background=True, timeout=0)
            await sbx.files.write("a.txt", "async file")
            assert await sbx.beta_pause() is True
            assert await sbx.pause() is False
            assert not await sbx.is_running()
            listed = await AsyncSandbox.list(
                query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
            assert sbx.sandbox_id in [s.sandbox_id for s in listed]
            same = await AsyncSandbox.connect(sbx.sandbox_id)
            assert await same.is_running()
            assert await same.files.read("a.txt") == "async file"
            assert bg.pid in [p.pid for p in await same.commands.list()]
            assert (await same.commands.run("echo $FOO")).stdout == "async\n"
            (kid,) = await sbx.fork(count=1)
            assert isinstance(kid, AsyncSandbox), kid
            try:
                assert await kid.files.read("a.txt") == "async file"
            finally:
                assert await kid.kill() is True
            assert await sbx.kill() is True
        finally:
            await AsyncSandbox.kill(sbx.sandbox_id)

    asyncio.run(scenario())


def test_snapshot_create_from_it_list_and_delete(node: NodeProcess) -> None:
    sbx = Sandbox.create(timeout=120)
    made: list[Sandbox] = []
    snaps: list[str] = []
    try:
        sbx.commands.run(COUNTER, background=True, timeout=0)
        sbx.commands.run("until [ -s /tmp/counter ]; do sleep 0.1; done")  # it has started
        sbx.files.write("state.txt", "step10")
        first = sbx.create_snapshot()
        snaps.append(first.snapshot_id)
        assert first.names == [] and sbx.is_running()  # the source keeps running
        sbx.files.write("state.txt", "later")
        name = f"e2e-{uuid.uuid4().hex[:8]}"
        second = sbx.create_snapshot(name=name)
        snaps.append(second.snapshot_id)
        assert second.names == [name]

        # a sandbox created from a snapshot starts at that state, processes included
        c = Sandbox.create(template=first.snapshot_id, timeout=300)
        made.append(c)
        assert c.files.read("state.txt") == "step10"
        n = _counter(c)
        _until(lambda: _counter(c) > n, timeout=30)
        assert sbx.files.read("state.txt") == "later"
        c.files.write("state.txt", "child")
        assert sbx.files.read("state.txt") == "later"
        # by name: the newest snapshot carrying it
        d = Sandbox.create(template=name, timeout=300)
        made.append(d)
        assert d.files.read("state.txt") == "later"

        # listing: this sandbox's snapshots, newest first, paginated
        pages = sbx.list_snapshots(limit=1)
        ids = [s.snapshot_id for s in pages.next_items()]
        assert pages.has_next
        ids += [s.snapshot_id for s in pages.next_items()]
        assert ids == [second.snapshot_id, first.snapshot_id] and not pages.has_next
        by_name = Sandbox.list_snapshots(name=name).next_items()
        assert [s.snapshot_id for s in by_name] == [second.snapshot_id]

        # delete: 204 then 404; it leaves listings at once; its children keep running
        assert Sandbox.delete_snapshot(first.snapshot_id) is True
        assert Sandbox.delete_snapshot(first.snapshot_id) is False
        left = [s.snapshot_id for s in Sandbox.list_snapshots(sandbox_id=sbx.sandbox_id)
                .next_items()]  # fmt: skip
        assert left == [second.snapshot_id]
        assert c.files.read("state.txt") == "child"
        with pytest.raises(Exception, match="404|not found"):
            Sandbox.create(template=first.snapshot_id, timeout=300)
    finally:
        for s in made:
            s.kill()
        sbx.kill()
        for sid in snaps:
            Sandbox.delete_snapshot(sid)


def test_fork_children_share_then_diverge(node: NodeProcess) -> None:
    sbx = Sandbox.create(timeout=300, metadata={"role": "parent"}, envs={"FOO": "forked"})
    kids: list[Sandbox] = []
    try:
        bg = sbx.commands.run("sleep 600", background=True, timeout=0)
        sbx.files.write("p.txt", "parent")
        out = sbx.fork(count=4, timeout=300)
        kids = [k for k in out if isinstance(k, Sandbox)]
        assert len(kids) == 4, out
        assert len({k.sandbox_id for k in kids} | {sbx.sandbox_id}) == 5
        rand = set()
        for k in kids:
            # the parent's file, process and env; then a value and a file of its own
            r = k.commands.run(f"cat p.txt; echo; echo $FOO; test -d /proc/{bg.pid} && echo "
                               f"alive; {RANDOM}; echo; echo {k.sandbox_id} > mine.txt")
            lines = r.stdout.splitlines()
            assert lines[:3] == ["parent", "forked", "alive"], lines
            rand.add(lines[3])
            info = k.get_info()
            assert info.metadata == {"role": "parent"} and info.state == SandboxState.RUNNING
        assert len(rand) == 4, "fork children share RNG output"
        assert sbx.commands.run(f"test -d /proc/{bg.pid} && echo alive").stdout == "alive\n"
        for k in kids:
            assert k.files.read("mine.txt") == k.sandbox_id + "\n"
        assert not sbx.files.exists("mine.txt") and sbx.is_running()
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
    finally:
        for k in kids:
            k.kill()
        sbx.kill()


@pytest.mark.long  # ~25 s; CI: fork children and restores
def test_sixteen_forks_read_distinct_randomness(node: NodeProcess) -> None:
    sbx = Sandbox.create(timeout=300)
    kids: list[Sandbox] = []
    try:
        out = sbx.fork(count=16, timeout=300)
        kids = [k for k in out if isinstance(k, Sandbox)]
        assert len(kids) == 16, [e for e in out if not isinstance(e, Sandbox)]

        def read(k: Sandbox) -> str:
            try:
                return k.commands.run(RANDOM).stdout
            finally:
                k.kill()  # fewer idle guests for the other reads (TCG)

        with ThreadPoolExecutor(8) as pool:
            values = set(pool.map(read, kids))
        assert len(values) == 16
    finally:
        for k in kids:
            k.kill()
        sbx.kill()


def test_a_resume_and_restores_of_one_state_read_distinct_randomness(node: NodeProcess) -> None:
    """One memory state brought back several ways, a resume of the paused sandbox and creates
    from a snapshot taken just before the pause, shares no RNG output: every restore pushes
    fresh entropy to /init and the guest reseeds before answering (forks: the test above)."""
    sbx = Sandbox.create(timeout=300)
    made: list[Sandbox] = []
    snap = None
    try:
        snap = sbx.create_snapshot().snapshot_id
        assert sbx.pause() is True
        values = [Sandbox.connect(sbx.sandbox_id).commands.run(RANDOM).stdout]
        for _ in range(3):
            made.append(Sandbox.create(template=snap, timeout=300))
            values.append(made[-1].commands.run(RANDOM).stdout)
        assert sbx.pause() is True  # and a second resume of the same sandbox
        values.append(Sandbox.connect(sbx.sandbox_id).commands.run(RANDOM).stdout)
        assert all(len(v) == 32 for v in values), values
        assert len(set(values)) == len(values), values
    finally:
        for s in made:
            s.kill()
        sbx.kill()
        if snap:
            Sandbox.delete_snapshot(snap)


def test_auto_pause_at_timeout_and_auto_resume_on_traffic(node: NodeProcess) -> None:
    auto = Sandbox.create(timeout=300, lifecycle={"on_timeout": "pause", "auto_resume": True})
    plain = Sandbox.create(timeout=300, lifecycle={"on_timeout": "pause"})
    try:
        info = auto.get_info()
        assert info.lifecycle == {"on_timeout": "pause", "auto_resume": True}
        for s in (auto, plain):
            s.files.write("f.txt", s.sandbox_id)
            s.set_timeout(1)
        _until(lambda: all(Sandbox.get_info(s.sandbox_id).state == SandboxState.PAUSED
                           for s in (auto, plain)))  # fmt: skip
        # no autoResume: a paused sandbox is "not found" on the data plane
        assert not plain.is_running()
        # autoResume: the request resumes it and goes through
        assert auto.files.read("f.txt") == auto.sandbox_id
        assert auto.get_info().state == SandboxState.RUNNING
        # connect resumes the other one
        Sandbox.connect(plain.sandbox_id)
        assert plain.files.read("f.txt") == plain.sandbox_id
    finally:
        auto.kill()
        plain.kill()
