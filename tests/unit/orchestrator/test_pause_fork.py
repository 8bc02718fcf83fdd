"""Pause, resume, auto-pause/resume, snapshots, fork and space admission in the orchestrator,
over the fake runtime (the real VMs are exercised by tests/e2e)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from aenv.machines.api import RuntimeError_, TemplateNotFound
from aenv.orchestrator.errors import (
    CapacityExhausted,
    InvalidRequest,
    NotFound,
    SpaceExhausted,
    StateConflict,
    Unsupported,
)
from aenv.orchestrator.fake import FakeRuntime
from aenv.orchestrator.service import CreateRequest, Orchestrator
from aenv.orchestrator.states import SandboxState
from aenv.orchestrator.store import SandboxRecord

from .conftest import make_config

S = SandboxState


def req(**kw: object) -> CreateRequest:
    base: dict[str, object] = {"template": "base", "timeout_s": 300}
    base.update(kw)
    return CreateRequest(**base)  # type: ignore[arg-type]


async def _until(cond, timeout: float = 3.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


# -- pause / resume ---------------------------------------------------------------------------


async def test_pause_then_connect_resumes_with_the_same_token(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    rec = await orch.create(req(env_vars={"FOO": "bar"}))
    sid = rec.sandbox_id
    await orch.pause(sid)
    paused = orch.get(sid)
    assert paused.state is S.PAUSED and paused.slot_addr is None
    assert orch.routes.get(sid) is None and runtime.is_paused(sid)
    with pytest.raises(StateConflict, match="already paused"):
        await orch.pause(sid)
    with pytest.raises(StateConflict):  # set_timeout needs a running sandbox
        await orch.set_timeout(sid, 10)

    before = orch.now_us()
    got, resumed = await orch.connect(sid, 60)
    assert resumed and got.state is S.RUNNING and got.access_token == rec.access_token
    # endAt = now + timeout on resume (not extend-only: the old endAt was later)
    assert before + 60_000_000 <= got.end_at_us < rec.end_at_us
    assert orch.routes.get(sid).access_token == rec.access_token
    init = runtime.inits[sid]
    assert init.access_token == rec.access_token and init.env_vars == {"FOO": "bar"}
    # running: extend-only, not resumed
    again, resumed = await orch.connect(sid, 1)
    assert not resumed and again.end_at_us == got.end_at_us


async def test_v1_resume_is_409_when_running_and_can_set_auto_pause(orch: Orchestrator) -> None:
    sid = (await orch.create(req())).sandbox_id
    with pytest.raises(StateConflict, match="running"):
        await orch.resume(sid, 15)
    await orch.pause(sid)
    rec = await orch.resume(sid, 15, auto_pause=True)
    assert rec.state is S.RUNNING and rec.auto_pause
    with pytest.raises(NotFound):
        await orch.pause("nope")


async def test_kill_of_a_paused_sandbox_deletes_its_state(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    sid = (await orch.create(req())).sandbox_id
    await orch.pause(sid)
    await orch.kill(sid)
    assert runtime.killed == [sid] and not runtime.is_paused(sid)
    with pytest.raises(NotFound):
        orch.get(sid)


async def test_failed_pause_keeps_it_running_or_removes_a_lost_vm(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    sid = (await orch.create(req())).sandbox_id
    runtime.fail_next_pause = RuntimeError_("save failed")
    with pytest.raises(RuntimeError_):
        await orch.pause(sid)
    assert orch.get(sid).state is S.RUNNING and orch.routes.get(sid) is not None

    class Losing(RuntimeError_):
        pass

    async def lose(sandbox_id: str, **_: object) -> None:
        runtime.live.pop(sandbox_id)
        raise Losing("VM died")

    runtime.pause = lose  # type: ignore[method-assign]
    with pytest.raises(Losing):
        await orch.pause(sid)
    assert orch.store.get(sid) is None and orch.routes.get(sid) is None


async def test_failed_resume_stays_paused(orch: Orchestrator, runtime: FakeRuntime) -> None:
    sid = (await orch.create(req())).sandbox_id
    await orch.pause(sid)
    runtime.fail_next_resume = RuntimeError_("restore failed")
    with pytest.raises(RuntimeError_):
        await orch.connect(sid, 60)
    assert orch.get(sid).state is S.PAUSED and orch.routes.get(sid) is None
    assert (await orch.connect(sid, 60))[1] is True


async def test_resume_respects_max_sandboxes(tmp_path: Path) -> None:
    o = Orchestrator(make_config(tmp_path, max_sandboxes=1), FakeRuntime())
    await o.start()
    try:
        a = (await o.create(req())).sandbox_id
        await o.pause(a)
        b = (await o.create(req())).sandbox_id
        with pytest.raises(CapacityExhausted):
            await o.connect(a, 60)
        assert o.get(a).state is S.PAUSED
        await o.kill(b)
        assert (await o.connect(a, 60))[1] is True
    finally:
        await o.close()


async def test_concurrent_connects_resume_once(orch: Orchestrator, runtime: FakeRuntime) -> None:
    runtime.boot_delay_s = 0.05
    sid = (await orch.create(req())).sandbox_id
    await orch.pause(sid)
    results = await asyncio.gather(*(orch.connect(sid, 60) for _ in range(5)))
    assert sorted(r[1] for r in results) == [False] * 4 + [True]


# -- TTL: auto-pause, auto-resume ---------------------------------------------------------


async def test_ttl_pauses_an_auto_pause_sandbox_and_kills_the_others(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    keep = (await orch.create(req(auto_pause=True))).sandbox_id
    gone = (await orch.create(req())).sandbox_id
    await orch.set_timeout(keep, 0)
    await orch.set_timeout(gone, 0)
    await _until(lambda: orch.store.get(gone) is None
                 and orch.store.get(keep).state is S.PAUSED)  # fmt: skip
    assert runtime.is_paused(keep) and orch.routes.get(keep) is None


async def test_failed_auto_pause_retries_later(orch: Orchestrator, runtime: FakeRuntime) -> None:
    sid = (await orch.create(req(auto_pause=True))).sandbox_id
    runtime.fail_next_pause = RuntimeError_("disk full")
    await orch.set_timeout(sid, 0)
    await _until(lambda: orch.store.get(sid).end_at_us > orch.now_us())
    assert orch.get(sid).state is S.RUNNING


async def test_auto_resume_route(orch: Orchestrator) -> None:
    auto = (await orch.create(req(auto_pause=True, auto_resume=True))).sandbox_id
    plain = (await orch.create(req(auto_pause=True))).sandbox_id
    for sid in (auto, plain):
        await orch.pause(sid)
    assert await orch.route_for_paused(plain) is None
    assert await orch.route_for_paused("nope") is None
    route = await orch.route_for_paused(auto)
    assert route is not None and route.sandbox_id == auto
    assert orch.get(auto).state is S.RUNNING and orch.get(plain).state is S.PAUSED


# -- snapshots --------------------------------------------------------------------------------


async def test_snapshot_is_a_template_by_id_and_by_name(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    src = await orch.create(req(metadata={"k": "v"}))
    a = await orch.snapshot(src.sandbox_id, "step")
    assert a.snapshot_id.startswith("snap-") and a.names == ["step"]
    assert a.parent == src.sandbox_id and orch.get(src.sandbox_id).state is S.RUNNING
    await asyncio.sleep(0.002)
    b = await orch.snapshot(src.sandbox_id, "step")
    c = await orch.snapshot(src.sandbox_id)
    assert c.names == []
    by_id = await orch.create(req(template=a.snapshot_id))
    assert by_id.template_id == a.snapshot_id and by_id.alias == "step"
    by_name = await orch.create(req(template="step"))
    assert by_name.template_id == b.snapshot_id  # the newest carrying the name
    with pytest.raises(InvalidRequest):
        await orch.snapshot(src.sandbox_id, "bad name!")
    await orch.pause(src.sandbox_id)
    with pytest.raises(StateConflict):
        await orch.snapshot(src.sandbox_id)
    page, nxt = orch.list_snapshots(sandbox_id=src.sandbox_id, limit=2)
    assert [s.snapshot_id for s in page] == [c.snapshot_id, b.snapshot_id] and nxt
    page, nxt = orch.list_snapshots(sandbox_id=src.sandbox_id, limit=2, cursor=nxt)
    assert [s.snapshot_id for s in page] == [a.snapshot_id] and nxt is None
    assert [s.snapshot_id for s in orch.list_snapshots(name="step")[0]] == [
        b.snapshot_id, a.snapshot_id]
    assert orch.list_snapshots(sandbox_id="other")[0] == []


async def test_delete_snapshot(orch: Orchestrator, runtime: FakeRuntime) -> None:
    src = await orch.create(req())
    snap = await orch.snapshot(src.sandbox_id)
    orch.delete_snapshot(snap.snapshot_id)
    assert snap.snapshot_id not in runtime.snapshots
    assert orch.list_snapshots()[0] == []
    with pytest.raises(NotFound):
        orch.delete_snapshot(snap.snapshot_id)
    with pytest.raises(TemplateNotFound):
        await orch.create(req(template=snap.snapshot_id))
    with pytest.raises(Unsupported, match="template"):
        orch.delete_snapshot("base")
    with pytest.raises(NotFound):
        orch.delete_snapshot("nope")


async def test_delete_during_a_restore_hides_at_once_and_frees_after(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    src = await orch.create(req())
    snap = (await orch.snapshot(src.sandbox_id)).snapshot_id
    runtime.boot_delay_s = 0.2
    creating = asyncio.create_task(orch.create(req(template=snap)))
    await asyncio.sleep(0.05)
    orch.delete_snapshot(snap)
    assert orch.list_snapshots()[0] == [] and snap in runtime.snapshots  # hidden, files kept
    with pytest.raises(TemplateNotFound):
        await orch.create(req(template=snap))
    with pytest.raises(NotFound):
        orch.delete_snapshot(snap)
    child = await creating
    assert child.state is S.RUNNING and snap not in runtime.snapshots


# -- fork -------------------------------------------------------------------------------------


async def test_fork_children_get_own_ids_tokens_and_the_source_env(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    src = await orch.create(req(metadata={"m": "1"}, env_vars={"FOO": "bar"}, timeout_s=120,
                                auto_pause=True))  # fmt: skip
    kids = await orch.fork(src.sandbox_id, 3)
    assert all(isinstance(k, SandboxRecord) for k in kids)
    ids = {k.sandbox_id for k in kids}  # type: ignore[union-attr]
    tokens = {k.access_token for k in kids}  # type: ignore[union-attr]
    assert len(ids) == 3 and src.sandbox_id not in ids
    assert len(tokens) == 3 and src.access_token not in tokens
    for k in kids:
        assert isinstance(k, SandboxRecord)
        assert k.state is S.RUNNING and k.metadata == {"m": "1"} and k.timeout_s == 120
        assert k.auto_pause and orch.routes.get(k.sandbox_id).access_token == k.access_token
        assert runtime.inits[k.sandbox_id].env_vars == {"FOO": "bar"}
    assert orch.get(src.sandbox_id).state is S.RUNNING
    (one,) = await orch.fork(src.sandbox_id, 1, timeout_s=30)
    assert isinstance(one, SandboxRecord) and one.timeout_s == 30
    for bad in (0, 21):
        with pytest.raises(InvalidRequest):
            await orch.fork(src.sandbox_id, bad)
    await orch.pause(src.sandbox_id)
    (kid,) = await orch.fork(src.sandbox_id, 1)  # a paused source forks and stays paused
    assert isinstance(kid, SandboxRecord) and kid.state is S.RUNNING
    assert orch.get(src.sandbox_id).state is S.PAUSED


async def test_fork_beyond_capacity_and_failed_children_are_error_entries(
    tmp_path: Path,
) -> None:
    runtime = FakeRuntime()
    o = Orchestrator(make_config(tmp_path, max_sandboxes=3), runtime)
    await o.start()
    try:
        src = await o.create(req())
        runtime.fail_next_create = RuntimeError_("restore failed")
        out = await o.fork(src.sandbox_id, 4)
        assert isinstance(out[0], RuntimeError_) and isinstance(out[1], SandboxRecord)
        assert all(isinstance(e, CapacityExhausted) for e in out[2:])
        assert {r.sandbox_id for r in o.store.all()} == {src.sandbox_id, out[1].sandbox_id}
    finally:
        await o.close()


# -- space admission --------------------------------------------------------------------------


async def test_space_admission_refuses_before_touching_anything(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    reserve = orch.config.disk_reserve_mib
    running = await orch.create(req())  # 512 MiB
    paused = await orch.create(req())
    await orch.pause(paused.sandbox_id)
    # exactly enough for what runs now + the reserve: nothing may add RAM
    orch.free_bytes = lambda: (512 + reserve) << 20
    with pytest.raises(SpaceExhausted, match="free space"):
        await orch.create(req())
    with pytest.raises(SpaceExhausted):
        await orch.connect(paused.sandbox_id, 60)
    with pytest.raises(SpaceExhausted):
        await orch.fork(running.sandbox_id, 1)
    assert orch.get(paused.sandbox_id).state is S.PAUSED
    assert len(orch.store.all()) == 2 and len(runtime.live) == 1
    snap = await orch.snapshot(running.sandbox_id)  # adds no RAM: allowed
    orch.free_bytes = lambda: ((512 + reserve) << 20) - 1
    with pytest.raises(SpaceExhausted):
        await orch.snapshot(running.sandbox_id)
    assert [s.snapshot_id for s in orch.list_snapshots()[0]] == [snap.snapshot_id]
    orch.free_bytes = lambda: (1024 + reserve) << 20
    assert (await orch.connect(paused.sandbox_id, 60))[1]


# -- shutdown and restart ---------------------------------------------------------------------


async def test_shutdown_pause_then_restart_lists_them_paused(tmp_path: Path) -> None:
    config = make_config(tmp_path, on_shutdown="pause")
    runtime = FakeRuntime()
    o = Orchestrator(config, runtime)
    await o.start()
    a = (await o.create(req())).sandbox_id
    b = (await o.create(req())).sandbox_id
    await o.pause(b)
    await o.close()
    assert set(runtime.paused) == {a, b} and runtime.live == {}

    runtime2 = FakeRuntime()
    runtime2.paused = dict(runtime.paused)  # the files are still on disk
    o2 = Orchestrator(config, runtime2)
    await o2.start()
    try:
        assert {r.sandbox_id: r.state for r in o2.store.all()} == {a: S.PAUSED, b: S.PAUSED}
        assert (await o2.connect(a, 60))[1]
    finally:
        await o2.close()
