"""Creates nobody received (orchestrator/orphans.py), over a real loopback HTTP server: a
client that leaves before the answer leaves no sandbox, unless its create carried an
`Idempotency-Key`, whose retry gets the same sandbox (and without a retry it goes after
the grace). The real-VM version is tests/e2e/test_orphans.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from aenv.api.app import Node
from aenv.orchestrator.fake import FakeRuntime

from .conftest import KEY, serve

BOOT_S = 0.6  # the fake boot: the client leaves halfway through it
GRACE_S = 1.0


@pytest.fixture
async def http(node: Node, runtime: FakeRuntime) -> AsyncIterator[httpx.AsyncClient]:
    runtime.boot_delay_s = BOOT_S
    node.orchestrator.orphans.keyed_grace_s = GRACE_S
    async with serve(node) as port, httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"X-API-Key": KEY}) as c:
        yield c


async def _leave(http: httpx.AsyncClient, **headers: str) -> None:
    """A create whose client gives up before the answer (its connection closes)."""
    with pytest.raises(httpx.ReadTimeout):
        await http.post("/v2/sandboxes", json={"templateID": "base"}, headers=headers,
                        timeout=BOOT_S / 2)  # fmt: skip


async def _settle(runtime: FakeRuntime, want: int, within_s: float, killed: int = 0) -> None:
    """Until `want` sandboxes live and `killed` were killed."""
    for _ in range(int(within_s / 0.05)):
        if len(runtime.live) == want and len(runtime.killed) == killed:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{len(runtime.live)} sandboxes live, not {want}; "
                         f"{len(runtime.killed)} killed, not {killed}")


async def test_a_create_nobody_received_is_removed(http: httpx.AsyncClient,
                                                   runtime: FakeRuntime) -> None:
    await _leave(http)
    await _settle(runtime, 0, BOOT_S * 2, killed=1)  # made, then removed
    assert (await http.get("/v2/sandboxes")).json() == []
    # a client that waits keeps its sandbox
    r = await http.post("/v2/sandboxes", json={"templateID": "base"})
    assert r.status_code == 201
    await asyncio.sleep(BOOT_S)
    assert [s["sandboxID"] for s in (await http.get("/v2/sandboxes")).json()] == [
        r.json()["sandboxID"]]


async def test_a_keyed_create_is_found_by_its_retry_and_kept(http: httpx.AsyncClient,
                                                             runtime: FakeRuntime) -> None:
    await _leave(http, **{"Idempotency-Key": "k1"})
    # the retry, while the first try still boots and after: the same sandbox each time
    tries = await asyncio.gather(*(http.post(
        "/v2/sandboxes", json={"templateID": "base"}, headers={"Idempotency-Key": "k1"})
        for _ in range(3)))  # fmt: skip
    assert {r.status_code for r in tries} == {201}
    assert len({r.json()["sandboxID"] for r in tries}) == 1
    await asyncio.sleep(GRACE_S + BOOT_S)
    assert len(runtime.live) == 1  # taken by a retry: kept past the grace
    # the same key with another request: 409, nothing made
    r = await http.post("/v2/sandboxes", json={"templateID": "base", "timeout": 30},
                        headers={"Idempotency-Key": "k1"})  # fmt: skip
    assert r.status_code == 409 and "different request" in r.json()["message"]
    assert len(runtime.live) == 1


async def test_a_keyed_create_with_no_retry_goes_after_the_grace(
        http: httpx.AsyncClient, runtime: FakeRuntime) -> None:
    await _leave(http, **{"Idempotency-Key": "k2"})
    await _settle(runtime, 1, BOOT_S * 2)
    await asyncio.sleep(GRACE_S / 2)
    assert len(runtime.live) == 1  # within the grace: a retry would still find it
    await _settle(runtime, 0, GRACE_S * 2, killed=1)
    # a failed create lets its key go: the retry is a new attempt
    bad = await http.post("/v2/sandboxes", json={"templateID": "nope"},
                          headers={"Idempotency-Key": "k3"})  # fmt: skip
    assert bad.status_code == 404
    r = await http.post("/v2/sandboxes", json={"templateID": "nope"},
                        headers={"Idempotency-Key": "k3"})  # fmt: skip
    assert r.status_code == 404 and len(runtime.live) == 0
