"""The hot tier's policy (`machines/hot.py`) with stand-in VMs: which kept VMMs become cold,
in which order, and why (budget by count and memory, the node's memory budget, age, memory
pressure, shutdown). Real hot VMMs: tests/e2e/test_hot_pause.py."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aenv.config import Config
from aenv.machines import hot


@dataclass
class _Spec:
    memory_file: Path = Path("/nonexistent")


@dataclass
class _Vm:
    pid: int = field(default_factory=os.getpid)  # a live process: its RSS is readable
    spec: _Spec = field(default_factory=_Spec)


@dataclass
class _Machine:
    name: str
    vm: _Vm = field(default_factory=_Vm)


def _tier(tmp_path: Path, **kw: object) -> tuple[hot.HotTier, list[str]]:
    cfg = Config.model_validate({"data_dir": tmp_path, "hot_release_delay_s": 3600, **kw})
    demoted: list[str] = []

    async def demote(m: _Machine) -> None:
        demoted.append(m.name)

    return hot.HotTier(cfg, demote), demoted  # type: ignore[arg-type]


async def test_beyond_the_count_budget_the_oldest_goes_cold(tmp_path: Path) -> None:
    tier, demoted = _tier(tmp_path, hot_pause_max=2)
    for n in ("a", "b", "c"):
        await tier.keep(_Machine(n))  # type: ignore[arg-type]
    assert demoted == ["a"] and tier.names() == {"b", "c"}
    assert tier.take("b") is not None and tier.take("b") is None  # taken once, for a resume
    assert not await tier.demote("b", "age")  # nothing to demote any more
    await tier.close()
    assert demoted == ["a", "c"] and not tier.names()  # shutdown: all of them


async def test_the_memory_budgets_demote_oldest_first(tmp_path: Path) -> None:
    rss_mib = hot.memory.process_rss(os.getpid()) >> 20  # each stand-in "holds" this much
    tier, demoted = _tier(tmp_path, hot_pause_memory_mib=2 * rss_mib + rss_mib // 2,
                          memory_budget_mib=10_000)  # fmt: skip
    for n in ("a", "b", "c"):
        await tier.keep(_Machine(n))  # type: ignore[arg-type]
    assert demoted == ["a"]  # three would hold more than the hot budget
    # A create of 10_000 - 1 MiB with nothing running: only room once both are cold.
    await tier.make_room(committed_mib=0, new_mib=10_000 - rss_mib)
    assert demoted == ["a", "b"] and tier.names() == {"c"}
    await tier.make_room(committed_mib=0, new_mib=10_000)
    assert demoted == ["a", "b", "c"]


async def test_age_and_pressure_demote_on_the_tick(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    tier, demoted = _tier(tmp_path, hot_pause_s=60)
    for n in ("old", "new"):
        await tier.keep(_Machine(n))  # type: ignore[arg-type]
    h = tier.get("old")
    assert h is not None
    h.paused_at -= 61  # paused a minute ago
    await tier._tick()
    assert demoted == ["old"] and tier.names() == {"new"}
    tier, demoted = _tier(tmp_path, hot_psi_avg10=20)
    for n in ("a", "b"):
        await tier.keep(_Machine(n))  # type: ignore[arg-type]
    monkeypatch.setattr(hot, "psi_some_avg10", lambda: 25.0)
    await tier._tick()
    assert demoted == ["a"]  # one a tick while the pressure lasts
    monkeypatch.setattr(hot, "psi_some_avg10", lambda: 5.0)
    await tier._tick()
    assert demoted == ["a"]


def test_psi_is_read_from_the_kernels_file(tmp_path: Path) -> None:
    f = tmp_path / "memory"
    f.write_text("some avg10=12.50 avg60=1.00 avg300=0.10 total=5\n"
                 "full avg10=3.00 avg60=0.00 avg300=0.00 total=1\n")  # fmt: skip
    assert hot.psi_some_avg10(f) == 12.5
    assert hot.psi_some_avg10(tmp_path / "absent") == 0.0


def test_the_tier_is_off_at_an_age_limit_of_zero(tmp_path: Path) -> None:
    assert not _tier(tmp_path, hot_pause_s=0)[0].enabled
    assert _tier(tmp_path)[0].enabled


async def test_a_second_demotion_or_a_kill_waits_for_the_one_under_way(tmp_path: Path) -> None:
    # A cold resume demotes (a no-op when another call already took the VMM) and then starts
    # a jail of the same name: it must not start before the old jail is torn down.
    cfg = Config.model_validate({"data_dir": tmp_path, "hot_release_delay_s": 3600})
    torn_down = asyncio.Event()
    order: list[str] = []

    async def slow_demote(m: _Machine) -> None:
        await torn_down.wait()
        order.append(f"{m.name} ended")

    tier = hot.HotTier(cfg, slow_demote)  # type: ignore[arg-type]
    await tier.keep(_Machine("a"))  # type: ignore[arg-type]
    first = asyncio.create_task(tier.demote("a", "memory"))
    await asyncio.sleep(0)

    async def resume() -> None:
        assert not await tier.demote("a", "reboot")
        order.append("resume goes on")

    second = asyncio.create_task(resume())
    waiting = asyncio.create_task(tier.ended("a"))
    await asyncio.sleep(0.05)
    assert not second.done() and not waiting.done()
    torn_down.set()
    assert await first
    await asyncio.gather(second, waiting)
    assert order == ["a ended", "resume goes on"]
