"""`envdReachable`: a running sandbox whose agent misses three probes in a row is reported
(detail and list), nothing is done to it, and one answer clears it."""

from __future__ import annotations

import asyncio

import httpx

from aenv.orchestrator.fake import FakeRuntime
from aenv.orchestrator.reachability import MISSES

from .test_control_plane import create

INTERVAL_S = 0.2  # conftest's metrics_interval_s


async def _until(client: httpx.AsyncClient, sid: str, reachable: bool) -> dict[str, object]:
    """The sandbox's detail once it says `reachable` (and, if so, when it was reached)."""
    for _ in range(int(MISSES * 10 / INTERVAL_S)):
        info = (await client.get(f"/sandboxes/{sid}")).json()
        if info.get("envdReachable") is reachable and (
                not reachable or "envdLastReachedAt" in info):
            return info
        await asyncio.sleep(INTERVAL_S / 2)
    raise AssertionError(f"envdReachable never became {reachable}: {info}")


async def test_an_agent_that_stops_answering_is_reported_and_cleared(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    sid = (await create(client))["sandboxID"]
    other = (await create(client))["sandboxID"]
    await _until(client, sid, True)
    runtime.unresponsive.add(sid)
    down = await _until(client, sid, False)
    assert down["state"] == "running" and sid in runtime.live  # reported, not acted on
    listed = {s["sandboxID"]: s for s in (await client.get("/v2/sandboxes")).json()}
    assert listed[sid]["envdReachable"] is False
    assert listed[sid]["envdLastReachedAt"] == down["envdLastReachedAt"]  # frozen since
    assert listed[other]["envdReachable"] is True
    runtime.unresponsive.discard(sid)
    back = await _until(client, sid, True)
    assert back["envdLastReachedAt"] > down["envdLastReachedAt"]
    # its kill works either way; a paused sandbox carries no such field
    runtime.unresponsive.add(other)
    await _until(client, other, False)
    assert (await client.delete(f"/sandboxes/{other}")).status_code == 204
    assert (await client.post(f"/sandboxes/{sid}/pause")).status_code == 204
    assert (await client.get(f"/sandboxes/{sid}")).json().get("envdReachable") is None
