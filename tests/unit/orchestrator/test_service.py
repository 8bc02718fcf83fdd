from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from aenv.config import Config
from aenv.machines.api import CapacityExceeded, TemplateNotFound
from aenv.orchestrator.errors import (
    CapacityExhausted,
    InvalidRequest,
    NotFound,
    ShuttingDown,
    StateConflict,
)
from aenv.orchestrator.fake import FakeRuntime
from aenv.orchestrator.requests import ID_ALPHABET, CreateRequest
from aenv.orchestrator.service import Orchestrator
from aenv.orchestrator.states import SandboxState

from .conftest import make_config

S = SandboxState


def req(**kw: object) -> CreateRequest:
    base: dict[str, object] = {"template": "base", "timeout_s": 300}
    base.update(kw)
    return CreateRequest(**base)  # type: ignore[arg-type]


async def test_create_gives_a_running_record_with_route_token_and_init(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    rec = await orch.create(req(metadata={"a": "b"}, env_vars={"FOO": "bar"}))
    assert len(rec.sandbox_id) == 20 and set(rec.sandbox_id) <= set(ID_ALPHABET)
    assert rec.state is S.RUNNING and rec.access_token
    assert orch.routes.get(rec.sandbox_id).access_token == rec.access_token
    init = runtime.inits[rec.sandbox_id]
    assert init.access_token == rec.access_token and init.env_vars == {"FOO": "bar"}
    assert rec.end_at_us - rec.started_at_us >= 300_000_000


async def test_insecure_create_has_no_token(orch: Orchestrator) -> None:
    rec = await orch.create(req(secure=False))
    assert rec.access_token is None


async def test_ids_and_tokens_are_unique(orch: Orchestrator) -> None:
    recs = [await orch.create(req()) for _ in range(5)]
    assert len({r.sandbox_id for r in recs}) == 5
    assert len({r.access_token for r in recs}) == 5


async def test_machine_shape_extension(orch: Orchestrator, runtime: FakeRuntime) -> None:
    rec = await orch.create(req(vcpus=2, memory_mib=1024))
    assert (rec.vcpus, rec.memory_mib) == (2, 1024)
    assert runtime.live[rec.sandbox_id].shape.vcpus == 2
    with pytest.raises(InvalidRequest, match="memoryMB"):
        await orch.create(req(memory_mib=1))


async def test_unknown_template_leaves_nothing(orch: Orchestrator) -> None:
    with pytest.raises(TemplateNotFound):
        await orch.create(req(template="nope"))
    assert orch.store.all() == []


async def test_failed_boot_leaves_no_record(orch: Orchestrator, runtime: FakeRuntime) -> None:
    runtime.fail_next_create = CapacityExceeded("no slots")
    with pytest.raises(CapacityExceeded):
        await orch.create(req())
    assert orch.store.all() == [] and len(orch.routes) == 0 and orch.boots.in_flight == 0


async def test_auto_pause_and_timeouts_are_validated(orch: Orchestrator) -> None:
    with pytest.raises(InvalidRequest, match="autoResume"):
        await orch.create(req(auto_resume=True))
    with pytest.raises(InvalidRequest):
        await orch.create(req(timeout_s=-1))
    with pytest.raises(InvalidRequest, match="greater"):
        await orch.create(req(timeout_s=10**9))


async def test_kill_removes_everything_then_404(orch: Orchestrator, runtime: FakeRuntime) -> None:
    rec = await orch.create(req())
    await orch.kill(rec.sandbox_id)
    assert runtime.killed == [rec.sandbox_id]
    assert orch.store.get(rec.sandbox_id) is None and orch.routes.get(rec.sandbox_id) is None
    with pytest.raises(NotFound):
        await orch.kill(rec.sandbox_id)
    with pytest.raises(NotFound):
        orch.get(rec.sandbox_id)


async def test_concurrent_kills_join_one_runtime_kill(
    orch: Orchestrator, runtime: FakeRuntime
) -> None:
    rec = await orch.create(req())
    gate = asyncio.Event()
    calls = 0
    real_kill = runtime.kill

    async def slow_kill(handle):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        await gate.wait()
        await real_kill(handle)

    runtime.kill = slow_kill  # type: ignore[method-assign]
    tasks = [asyncio.create_task(orch.kill(rec.sandbox_id)) for _ in range(5)]
    await asyncio.sleep(0.05)
    assert orch.store.get(rec.sandbox_id).state is S.KILLING
    with pytest.raises(NotFound):  # Killing is invisible
        orch.get(rec.sandbox_id)
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results == [None] * 5 and calls == 1


async def test_calls_wait_for_an_in_flight_boot(tmp_path: Path) -> None:
    runtime = FakeRuntime(boot_delay_s=0.2)
    o = Orchestrator(make_config(tmp_path), runtime)
    await o.start()
    try:
        create = asyncio.create_task(o.create(req()))
        await asyncio.sleep(0.05)
        [creating] = o.store.all()
        assert creating.state is S.CREATING
        # kill on a Creating sandbox waits for the boot, then kills it
        await o.kill(creating.sandbox_id)
        rec = await create
        assert rec.sandbox_id == creating.sandbox_id
        assert o.store.get(rec.sandbox_id) is None and runtime.live == {}
    finally:
        await o.close()


async def test_waiting_for_a_transition_is_bounded(tmp_path: Path) -> None:
    o = Orchestrator(make_config(tmp_path, transition_wait_s=0.1), FakeRuntime())
    await o.start()
    try:
        rec = await o.create(req())
        async with o._locks.hold(rec.sandbox_id):
            with pytest.raises(StateConflict, match="in progress"):
                await o.set_timeout(rec.sandbox_id, 10)
    finally:
        await o.close()


async def test_set_timeout_can_shorten_and_connect_only_extends(orch: Orchestrator) -> None:
    rec = await orch.create(req(timeout_s=300))
    await orch.set_timeout(rec.sandbox_id, 10)
    end = orch.get(rec.sandbox_id).end_at_us
    assert end < rec.end_at_us
    same, resumed = await orch.connect(rec.sandbox_id, 5)
    assert not resumed and same.end_at_us == end
    longer, _ = await orch.connect(rec.sandbox_id, 100)
    assert longer.end_at_us > end
    await orch.refresh(rec.sandbox_id, 1)
    assert orch.get(rec.sandbox_id).end_at_us == longer.end_at_us
    with pytest.raises(InvalidRequest):
        await orch.refresh(rec.sandbox_id, 100000)
    with pytest.raises(NotFound):
        await orch.set_timeout("nope", 10)
    with pytest.raises(NotFound):
        await orch.connect("nope", 10)


async def test_ttl_sweeper_kills_at_end(orch: Orchestrator, runtime: FakeRuntime) -> None:
    rec = await orch.create(req())
    keep = await orch.create(req())
    await orch.set_timeout(rec.sandbox_id, 0)
    t0 = time.monotonic()
    while orch.store.get(rec.sandbox_id) is not None:
        assert time.monotonic() - t0 < 2, "sweeper did not kill the expired sandbox"
        await asyncio.sleep(0.02)
    assert rec.sandbox_id in runtime.killed
    assert orch.get(keep.sandbox_id).state is S.RUNNING


async def test_expire_skips_a_sandbox_extended_meanwhile(orch: Orchestrator) -> None:
    rec = await orch.create(req())
    await orch.expire(rec.sandbox_id)  # not expired
    assert orch.get(rec.sandbox_id).state is S.RUNNING


async def test_capacity_max_sandboxes(tmp_path: Path) -> None:
    o = Orchestrator(make_config(tmp_path, max_sandboxes=2), FakeRuntime())
    await o.start()
    try:
        a = await o.create(req())
        await o.create(req())
        with pytest.raises(CapacityExhausted) as e:
            await o.create(req())
        assert e.value.retry_after_s >= 1
        await o.kill(a.sandbox_id)
        await o.create(req())
    finally:
        await o.close()


async def test_a_burst_past_max_concurrent_boots_queues_then_is_refused(tmp_path: Path) -> None:
    """50 creates at once, 4 boots at a time of 0.1 s: those that can start within
    admission_queue_s wait for a boot slot; the rest get 429 with Retry-After."""
    o = Orchestrator(make_config(tmp_path, max_concurrent_boots=4, admission_queue_s=0.45),
                     FakeRuntime(boot_delay_s=0.1))  # fmt: skip
    await o.start()
    try:
        results = await asyncio.gather(
            *(o.create(req()) for _ in range(50)), return_exceptions=True
        )
        ok = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, CapacityExhausted)]
        assert len(ok) + len(refused) == 50
        assert 12 <= len(ok) <= 24, len(ok)  # about 4 waves of 4 in 0.45 s
        assert all(r.retry_after_s >= 1 and "wait for them" in str(r) for r in refused)
        assert o.boots.in_flight == 0 and o.boots.waiting == 0
        assert len(o.store.all()) == len(ok)
        # a queue as long as the burst needs: every one runs
        o.boots.queue_s = 10
        more = await asyncio.gather(*(o.create(req()) for _ in range(20)))
        assert len(more) == 20 and o.boots.waiting == 0
    finally:
        await o.close()


async def test_metrics_are_sampled_and_windowed(orch: Orchestrator) -> None:
    rec = await orch.create(req())
    now = orch.now_us()
    samples = await orch.metrics(rec.sandbox_id, rec.started_at_us, now + 10_000_000)
    assert len(samples) == 1 and samples[0].mem_total == 512 << 20
    assert await orch.metrics(rec.sandbox_id, 0, rec.started_at_us - 1) == []
    await asyncio.sleep(0.5)  # the background sampler adds more
    assert len(await orch.metrics(rec.sandbox_id, 0, orch.now_us())) >= 2


async def test_close_kills_everything_and_refuses_creates(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    o = Orchestrator(make_config(tmp_path), runtime)
    await o.start()
    await o.create(req())
    await o.create(req())
    o.begin_shutdown()
    with pytest.raises(ShuttingDown):
        await o.create(req())
    await o.close()
    assert runtime.closed and runtime.live == {}
    o2 = Orchestrator(make_config(tmp_path), FakeRuntime())
    await o2.start()
    try:
        assert o2.store.all() == []
    finally:
        await o2.close()


async def _seed(config: Config, states: dict[str, SandboxState]) -> None:
    """Write records as a crashed node would have left them."""
    o = Orchestrator(config, FakeRuntime())
    o.store.open()
    for sid, state in states.items():
        from aenv.orchestrator.store import SandboxRecord

        o.store.insert(SandboxRecord(
            sandbox_id=sid, template_id="base", state=S.CREATING, started_at_us=1,
            end_at_us=10**18, timeout_s=300, vcpus=1, memory_mib=512, disk_mib=4096,
            envd_version="0.6.4", slot_addr="198.18.0.2", vmm_pid=1,
        ))  # fmt: skip
        o.store.force_state(sid, state, 1)
    o.store.close()


async def test_restart_recovery_table_without_adoption(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    await _seed(config, {str(s): s for s in S})
    runtime = FakeRuntime()
    # the paused state on disk of what was paused, pausing (finished) and resuming
    runtime.paused = {sid: None for sid in ("paused", "pausing", "resuming")}  # type: ignore[misc]
    o = Orchestrator(config, runtime)
    await o.start()
    try:
        left = {r.sandbox_id: r.state for r in o.store.all()}
        assert left == {"paused": S.PAUSED, "pausing": S.PAUSED, "resuming": S.PAUSED}
        assert len(o.routes) == 0
    finally:
        await o.close()


async def test_restart_readopts_what_the_runtime_still_runs(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    await _seed(config, {"alive": S.RUNNING, "dead": S.RUNNING, "mid": S.CREATING,
                         "sleeping": S.PAUSED})  # fmt: skip

    class Adopting(FakeRuntime):
        async def adopt(self, handles):  # type: ignore[no-untyped-def]
            self.offered = [h.sandbox_id for h in handles]
            return [h for h in handles if h.sandbox_id == "alive"]

        async def reclaim(self, keep):  # type: ignore[no-untyped-def]
            self.kept = set(keep)
            return ["cgroup:dead", "cgroup:mid"]

    runtime = Adopting()
    runtime.paused = {"sleeping": None}  # type: ignore[dict-item]
    o = Orchestrator(config, runtime)
    await o.start()
    try:
        assert sorted(runtime.offered) == ["alive", "dead"]
        assert runtime.kept == {"alive", "sleeping"}
        assert {r.sandbox_id for r in o.store.all()} == {"alive", "sleeping"}
        assert o.routes.get("alive") is not None
    finally:
        await o.close()
