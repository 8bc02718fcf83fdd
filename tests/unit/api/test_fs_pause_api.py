"""Filesystem-only pause and reboot-resume over HTTP (fake runtime): fields, validation,
what reaches the runtime, pauseMode, auto-pause without memory, admission of a reboot."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from aenv.api.app import Node
from aenv.machines.api import RuntimeError_
from aenv.orchestrator.fake import FakeRuntime

from .conftest import KEY, make_config
from .test_control_plane import assert_error, create


async def _info(client: httpx.AsyncClient, sid: str) -> dict:
    r = await client.get(f"/sandboxes/{sid}")
    assert r.status_code == 200, r.text
    return r.json()


async def test_memory_false_pauses_filesystem_only_and_connect_reboots(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    sb = await create(client)
    sid = sb["sandboxID"]
    r = await client.post(f"/sandboxes/{sid}/pause", json={"memory": False})
    assert r.status_code == 204 and r.content == b""
    assert runtime.paused_memory[sid] is False
    info = await _info(client, sid)
    assert info["state"] == "paused" and info["pauseMode"] == "filesystem"
    # connect without memory: false still reboots (there is no memory to restore)
    r = await client.post(f"/v2/sandboxes/{sid}/connect", json={"timeout": 60})
    assert r.status_code == 201 and r.json()["envdAccessToken"] == sb["envdAccessToken"]
    assert runtime.resumes[-1] == (sid, "reboot")
    assert runtime.inits[sid].access_token == sb["envdAccessToken"]
    assert "pauseMode" not in await _info(client, sid)

    # a full pause, then connect with memory: false -> reboot, the memory discarded
    assert (await client.post(f"/sandboxes/{sid}/pause", json={})).status_code == 204
    assert (await _info(client, sid))["pauseMode"] == "full"
    r = await client.post(f"/v2/sandboxes/{sid}/connect", json={"memory": False})
    assert r.status_code == 201
    assert runtime.resumes[-1] == (sid, "reboot")
    # running: memory false changes nothing (200, no resume)
    r = await client.post(f"/v2/sandboxes/{sid}/connect", json={"memory": False})
    assert r.status_code == 200 and len(runtime.resumes) == 2

    # a full pause with a plain connect restores the memory state
    assert (await client.post(f"/sandboxes/{sid}/pause")).status_code == 204
    assert (await client.post(f"/sandboxes/{sid}/connect", json={})).status_code == 201
    assert runtime.resumes[-1] == (sid, "restore")
    assert (await client.delete(f"/sandboxes/{sid}")).status_code == 204


async def test_pause_connect_and_create_fields_must_be_booleans(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    sid = (await create(client))["sandboxID"]
    for body in ({"memory": "false"}, {"memory": 0}, {"memory": None, "requireHealthyGuest": 1}):
        assert_error(await client.post(f"/sandboxes/{sid}/pause", json=body), 400)
    for body in ({"memory": "no"}, {"memory": 0}):
        assert_error(await client.post(f"/v2/sandboxes/{sid}/connect", json=body), 400)
    assert_error(await client.post("/v2/sandboxes", json={
        "templateID": "base", "autoPause": True, "autoPauseMemory": "false"}), 400)
    # nothing happened to the sandbox
    assert (await _info(client, sid))["state"] == "running" and runtime.paused == {}
    # explicit nulls are "not set"
    r = await client.post(f"/sandboxes/{sid}/pause",
                          json={"memory": None, "requireHealthyGuest": None})
    assert r.status_code == 204 and runtime.paused_memory[sid] is True


async def test_strict_pause_of_an_unresponsive_guest_is_503_and_it_keeps_running(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    sid = (await create(client))["sandboxID"]
    runtime.unresponsive.add(sid)
    for body in ({"requireHealthyGuest": True}, {"memory": False, "requireHealthyGuest": True}):
        assert_error(await client.post(f"/sandboxes/{sid}/pause", json=body), 503, "answer")
        assert (await _info(client, sid))["state"] == "running"
        assert sid in runtime.live
    # not strict: paused anyway
    r = await client.post(f"/sandboxes/{sid}/pause", json={"memory": False})
    assert r.status_code == 204 and runtime.paused_memory[sid] is False


async def test_auto_pause_memory_false_pauses_filesystem_only_at_the_timeout(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    assert_error(await client.post("/v2/sandboxes", json={
        "templateID": "base", "autoPause": True, "autoPauseMemory": False,
        "autoResume": {"enabled": True}}), 400, "autoPauseMemory")
    sid = (await create(client, timeout=1, autoPause=True, autoPauseMemory=False))["sandboxID"]
    full = (await create(client, timeout=1, autoPause=True))["sandboxID"]
    for _ in range(100):
        if sid in runtime.paused and full in runtime.paused:
            break
        await asyncio.sleep(0.05)
    assert runtime.paused_memory == {sid: False, full: True}
    assert (await _info(client, sid))["pauseMode"] == "filesystem"
    assert (await _info(client, full))["pauseMode"] == "full"
    assert (await client.post(f"/v2/sandboxes/{sid}/connect", json={})).status_code == 201
    assert runtime.resumes == [(sid, "reboot")]
    # resumed by reboot, the lifecycle stays: the next timeout pauses filesystem-only again
    assert (await _info(client, sid))["lifecycle"] == {"onTimeout": "pause", "autoResume": False}


async def test_traffic_does_not_auto_resume_a_filesystem_only_pause(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    sb = await create(client, autoPause=True, autoResume={"enabled": True})
    sid = sb["sandboxID"]
    assert (await client.post(f"/sandboxes/{sid}/pause", json={"memory": False})).status_code \
        == 204
    r = await client.get("/health", headers={"E2b-Sandbox-Id": sid,
                                             "X-Access-Token": sb["envdAccessToken"]})
    assert r.status_code == 502 and "was not found" in r.json()["message"]
    assert (await _info(client, sid))["state"] == "paused" and runtime.resumes == []


async def test_a_reboot_counts_against_max_concurrent_boots(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    node = Node(make_config(tmp_path, max_concurrent_boots=1, admission_queue_s=0.1), runtime)
    await node.start()
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=node), base_url="http://aenv",
            headers={"X-API-Key": KEY},
        ) as c:  # fmt: skip
            sid = (await create(c))["sandboxID"]
            assert (await c.post(f"/sandboxes/{sid}/pause", json={})).status_code == 204
            runtime.boot_delay_s = 0.5
            reboot = asyncio.create_task(
                c.post(f"/v2/sandboxes/{sid}/connect", json={"memory": False}))
            await asyncio.sleep(0.2)
            assert not reboot.done()
            assert_error(await c.post("/v2/sandboxes", json={"templateID": "base"}), 429)
            assert (await reboot).status_code == 201
            runtime.boot_delay_s = 0.0
            assert (await c.post("/v2/sandboxes", json={"templateID": "base"})).status_code \
                == 201
    finally:
        await node.close()


@pytest.mark.parametrize("body", [None, {}])
async def test_pause_without_a_body_is_a_full_pause(
    client: httpx.AsyncClient, runtime: FakeRuntime, body: dict | None
) -> None:
    sid = (await create(client))["sandboxID"]
    r = await client.post(f"/sandboxes/{sid}/pause", json=body)
    assert r.status_code == 204 and runtime.paused_memory[sid] is True


async def test_a_failed_reboot_leaves_it_paused_filesystem_only(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    sid = (await create(client))["sandboxID"]
    assert (await client.post(f"/sandboxes/{sid}/pause")).status_code == 204
    runtime.fail_next_resume = RuntimeError_("boot failed")
    assert_error(await client.post(f"/v2/sandboxes/{sid}/connect", json={"memory": False}), 500)
    info = await _info(client, sid)
    assert info["state"] == "paused" and info["pauseMode"] == "filesystem"
    assert (await client.post(f"/v2/sandboxes/{sid}/connect", json={})).status_code == 201
    assert runtime.resumes == [(sid, "reboot")]
