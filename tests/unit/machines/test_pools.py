"""The pool bookkeeping (`machines/pools.py`) with stand-in VMs: what it keeps ready,
what a take returns, when it refills, what it does with a VM that dies pooled or is made
after the key changed, and that close ends everything. Real pooled VMs are exercised by the
e2e tests (test_primed.py, test_vmm_exit.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from aenv.machines.api import VmmExit
from aenv.machines.pools import RecentPools, VmPool


@dataclass
class FakeVm:
    """Stands in for runtime.Machine: a name, a watcher task, an exit to trigger."""

    name: str
    key: str
    watcher: asyncio.Task[None] | None = None
    died: Callable[[FakeVm, VmmExit], None] | None = None


@dataclass
class Maker:
    made: list[FakeVm] = field(default_factory=list)
    destroyed: list[str] = field(default_factory=list)
    fail: bool = False
    gate: asyncio.Event | None = None  # hold every make until set

    async def make(self, key: str) -> FakeVm:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError("no VM today")
        vm = FakeVm(f"pool-{len(self.made)}", key)
        self.made.append(vm)
        return vm

    async def destroy(self, vm: FakeVm) -> None:
        self.destroyed.append(vm.name)
        if vm.watcher is not None:
            vm.watcher.cancel()  # a destroyed VM's watcher ends with its VMM

    def watch(self, vm: FakeVm, died: Callable[[FakeVm, VmmExit], None]) -> None:
        vm.died = died
        vm.watcher = asyncio.get_running_loop().create_task(asyncio.sleep(3600))


def _pool(mk: Maker, size: int = 2, delay: float = 0.0) -> VmPool[str]:
    return VmPool("test_pool", size, mk.make, mk.destroy, mk.watch,  # type: ignore[arg-type]
                  refill_delay_s=delay)


async def test_fills_to_size_and_a_take_is_refilled() -> None:
    mk = Maker()
    pool = _pool(mk)
    assert pool.take("k") is None  # not configured: nothing
    pool.configure("k")
    await pool.settle()
    assert len(pool) == 2 and pool.names() == {"pool-0", "pool-1"}
    assert pool.take("other") is None  # another key: nothing taken
    vm = pool.take("k")
    assert vm is not None and vm.name == "pool-0"
    await _watch_cancelled(vm)  # the sandbox it becomes is watched by its taker
    await pool.settle()
    assert len(pool) == 2 and len(mk.made) == 3
    await pool.close()
    assert sorted(mk.destroyed) == ["pool-1", "pool-2"] and len(pool) == 0
    vm.watcher = None


async def _watch_cancelled(vm: FakeVm) -> None:
    assert vm.watcher is not None
    with pytest.raises(asyncio.CancelledError):
        await vm.watcher


async def test_a_delayed_refill_waits_and_coalesces() -> None:
    mk = Maker()
    pool = _pool(mk, size=2, delay=0.3)
    pool.configure("k")
    await pool.settle()
    assert pool.take("k") is not None and pool.take("k") is not None
    await pool.settle()
    assert len(pool) == 0  # nothing made yet: the refill waits
    await asyncio.sleep(0.5)
    await pool.settle()
    assert len(pool) == 2 and len(mk.made) == 4  # both replaced by one delayed refill
    await pool.close()


async def test_close_cancels_a_pending_refill() -> None:
    mk = Maker()
    pool = _pool(mk, size=1, delay=0.2)
    pool.configure("k")
    await pool.settle()
    assert pool.take("k") is not None
    await pool.close()
    await asyncio.sleep(0.3)
    assert len(mk.made) == 1 and len(pool) == 0


async def test_a_vm_that_dies_pooled_is_destroyed_and_replaced() -> None:
    mk = Maker()
    pool = _pool(mk, size=1)
    pool.configure("k")
    await pool.settle()
    (vm,) = mk.made
    assert vm.died is not None
    vm.watcher.cancel()  # its VMM ended
    vm.died(vm, VmmExit(signal="SIGKILL"))
    assert len(pool) == 0
    await asyncio.sleep(0.05)
    assert mk.destroyed == ["pool-0"]
    await asyncio.sleep(1.2)  # pools.RESPAWN_DELAY_S
    await pool.settle()
    assert pool.names() == {"pool-1"}
    await pool.close()


async def test_a_vm_made_for_an_old_key_is_destroyed_and_failures_do_not_break_it() -> None:
    mk = Maker(gate=asyncio.Event())
    pool = _pool(mk, size=1)
    pool.configure("old")
    await asyncio.sleep(0)
    pool.configure("new")  # a new default template while the old one's VM is being made
    mk.gate.set()
    await pool.settle()
    assert [v.key for v in mk.made][:1] == ["old"] and "pool-0" in mk.destroyed
    assert all(v.key == "new" for v in mk.made if v.name in pool.names())
    await pool.close()

    bad = Maker(fail=True)
    pool = _pool(bad, size=2)
    pool.configure("k")
    await pool.settle()
    assert len(pool) == 0 and pool.take("k") is None  # logged, not raised
    await pool.close()


def _recent(mk: Maker, size: int, delay: float = 0.0) -> RecentPools[str]:
    return RecentPools("test_recent", size, mk.make, mk.destroy, mk.watch,  # type: ignore[arg-type]
                       refill_delay_s=delay)


def _keys(mk: Maker) -> list[str]:
    return [vm.key for vm in mk.made if vm.name not in mk.destroyed]


async def test_recent_pools_share_one_budget_newest_first() -> None:
    mk = Maker()
    pools = _recent(mk, size=4, delay=0.2)
    pools.use("a")
    await pools.settle()
    assert len(pools) == 0  # not while the create that used "a" starts
    await asyncio.sleep(0.3)
    await pools.settle()
    assert _keys(mk) == ["a"] * 4 and pools.keys() == ["a"]
    pools.use("a")  # the same key again: nothing changes
    assert len(mk.made) == 4 and not mk.destroyed
    pools.use("b")  # "a" keeps one at once, "b" gets three after the delay
    await asyncio.sleep(0.01)
    assert len(mk.destroyed) == 3 and _keys(mk) == ["a"]
    await asyncio.sleep(0.3)
    await pools.settle()
    assert sorted(_keys(mk)) == ["a", "b", "b", "b"]
    pools.use("c")
    pools.use("d")
    pools.use("e")  # five keys for a budget of four: "a", the oldest, falls out
    await asyncio.sleep(0.3)
    await pools.settle()
    assert pools.keys() == ["b", "c", "d", "e"]
    assert sorted(_keys(mk)) == ["b", "c", "d", "e"] and len(pools) == 4
    assert pools.take("a") is None
    vm = pools.take("e")
    assert vm is not None and vm.key == "e"
    vm.watcher = None
    pools.forget("c")  # its snapshot was deleted: its share goes to the newest
    await asyncio.sleep(0.3)
    await pools.settle()
    assert pools.keys() == ["b", "d", "e"] and sorted(_keys(mk)) == ["b", "d", "e", "e", "e"]
    await pools.close()
    assert len(pools) == 0 and _keys(mk) == ["e"]  # only the VM taken is left, to its taker
    disabled = _recent(Maker(), size=0)
    disabled.use("x")
    assert disabled.keys() == []  # a disabled pool makes nothing


async def test_a_pool_shrunk_while_making_keeps_only_its_new_size() -> None:
    mk = Maker(gate=asyncio.Event())
    pool = _pool(mk, size=0)
    pool.key = "k"
    pool.resize(2)  # two makes in flight, held at the gate
    await asyncio.sleep(0.01)
    pool.resize(1)
    mk.gate.set()  # type: ignore[union-attr]
    await pool.settle()
    assert len(pool) == 1 and len(mk.made) == 2 and len(mk.destroyed) == 1
    await pool.close()
