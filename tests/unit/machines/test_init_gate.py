"""The gate of fork children's /init (machines/init_gate.py): at most n at once, first come
first served, and a child a request waits for goes before those nobody asked for."""

from __future__ import annotations

import asyncio

import pytest

from aenv.machines.init_gate import InitGate


async def _run(gate: InitGate, names: list[str], hurried: list[str]) -> list[str]:
    order: list[str] = []
    release = asyncio.Event()

    async def one(name: str) -> None:
        async with gate.hold(name):
            order.append(name)
            await release.wait()

    tasks = [asyncio.create_task(one(n)) for n in names]
    await asyncio.sleep(0)
    for n in hurried:
        gate.hurry(n)
    release.set()
    await asyncio.gather(*tasks)
    return order


async def test_two_at_a_time_in_order_and_a_hurried_one_first() -> None:
    assert await _run(InitGate(2), list("abcdef"), []) == list("abcdef")
    assert await _run(InitGate(2), list("abcdef"), ["e", "a"]) == ["a", "b", "e", "c", "d", "f"]


async def test_at_most_n_hold_it() -> None:
    gate, held, most = InitGate(3), 0, 0

    async def one(i: int) -> None:
        nonlocal held, most
        async with gate.hold(str(i)):
            held += 1
            most = max(most, held)
            await asyncio.sleep(0.001)
            held -= 1

    await asyncio.gather(*(one(i) for i in range(20)))
    assert most == 3


async def test_a_cancelled_waiter_gives_its_turn_on() -> None:
    gate = InitGate(1)
    first_in = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with gate.hold("a"):
            first_in.set()
            await release.wait()

    h = asyncio.create_task(holder())
    await first_in.wait()
    waiter = asyncio.create_task(gate.hold("b").__aenter__())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    await h
    async with asyncio.timeout(1):
        async with gate.hold("c"):
            pass
