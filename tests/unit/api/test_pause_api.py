"""Pause, resume, snapshots and fork over HTTP (fake runtime): status codes and bodies."""

from __future__ import annotations

import httpx
import pytest

from aenv.api.app import Node
from aenv.machines.api import RuntimeError_
from aenv.orchestrator.fake import FakeRuntime

from .test_control_plane import assert_error, create


def dp(sb: dict) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sb["sandboxID"], "X-Access-Token": sb["envdAccessToken"]}


async def test_pause_resume_codes_and_states(client: httpx.AsyncClient) -> None:
    sb = await create(client)
    sid = sb["sandboxID"]
    assert_error(await client.post("/sandboxes/nope/pause"), 404)
    r = await client.post(f"/sandboxes/{sid}/pause", json={})
    assert r.status_code == 204 and r.content == b""
    assert_error(await client.post(f"/sandboxes/{sid}/pause"), 409, "already paused")
    # an empty body is a full pause (filesystem-only: test_fs_pause_api.py)
    info = (await client.get(f"/sandboxes/{sid}")).json()
    assert info["state"] == "paused" and info["pauseMode"] == "full"
    listed = (await client.get("/v2/sandboxes", params={"state": "paused"})).json()
    assert [s["sandboxID"] for s in listed] == [sid]
    assert (await client.get("/v2/sandboxes", params={"state": "running"})).json() == []
    assert (await client.get("/sandboxes")).json() == []  # v1 lists running ones
    # data plane: paused is "not found"
    r = await client.get("/health", headers=dp(sb))
    assert r.status_code == 502 and "was not found" in r.json()["message"]
    # connect resumes (201) with the same token; again: 200
    r = await client.post(f"/v2/sandboxes/{sid}/connect", json={})
    assert r.status_code == 201 and r.json()["envdAccessToken"] == sb["envdAccessToken"]
    r = await client.post(f"/sandboxes/{sid}/connect", json={"timeout": 10})
    assert r.status_code == 200
    assert "pauseMode" not in (await client.get(f"/sandboxes/{sid}")).json()
    # v1 resume
    assert_error(await client.post(f"/sandboxes/{sid}/resume", json={}), 409, "running")
    assert (await client.post(f"/sandboxes/{sid}/pause", json={"memory": False})).status_code \
        == 204
    r = await client.post(f"/sandboxes/{sid}/resume", json={"timeout": 30, "autoPause": True})
    assert r.status_code == 201 and r.json()["sandboxID"] == sid
    assert (await client.get(f"/sandboxes/{sid}")).json()["lifecycle"] == {
        "onTimeout": "pause", "autoResume": False}
    assert_error(await client.post("/sandboxes/nope/resume"), 404)
    assert_error(await client.post(f"/sandboxes/{sid}/pause", json={"memory": "no"}), 400)
    # kill of a paused sandbox
    await client.post(f"/sandboxes/{sid}/pause")
    assert (await client.delete(f"/sandboxes/{sid}")).status_code == 204
    assert_error(await client.post(f"/v2/sandboxes/{sid}/connect", json={}), 404)


async def test_auto_pause_and_auto_resume_through_the_data_plane(
    client: httpx.AsyncClient, node: Node
) -> None:
    auto = await create(client, autoPause=True, autoResume={"enabled": True})
    plain = await create(client, autoPause=True)
    info = (await client.get(f"/sandboxes/{auto['sandboxID']}")).json()
    assert info["lifecycle"] == {"onTimeout": "pause", "autoResume": True}
    for sb in (auto, plain):
        assert (await client.post(f"/sandboxes/{sb['sandboxID']}/pause")).status_code == 204
    r = await client.get("/health", headers=dp(plain))
    assert r.status_code == 502 and "was not found" in r.json()["message"]
    # resumed, then proxied (nothing listens behind the fake runtime: "port is not open")
    r = await client.get("/health", headers=dp(auto))
    assert r.status_code == 502 and "port is not open" in r.json()["message"]
    assert (await client.get(f"/sandboxes/{auto['sandboxID']}")).json()["state"] == "running"
    assert_error(await client.post("/v2/sandboxes", json={
        "templateID": "base", "autoResume": {"enabled": True}}), 400, "autoResume")


async def test_snapshots_create_list_paginate_delete(client: httpx.AsyncClient) -> None:
    sid = (await create(client, metadata={"a": "b"}))["sandboxID"]
    assert_error(await client.post("/sandboxes/nope/snapshots", json={}), 404)
    ids = []
    for name in ("one", None, "one"):
        r = await client.post(f"/sandboxes/{sid}/snapshots", json={"name": name} if name else {})
        assert r.status_code == 201, r.text
        body = r.json()
        assert set(body) == {"snapshotID", "names"}
        assert body["names"] == ([name] if name else [])
        ids.append(body["snapshotID"])
    assert_error(await client.post(f"/sandboxes/{sid}/snapshots", json={"name": "a b"}), 400)
    # newest first, two per page
    r = await client.get("/snapshots", params={"sandboxID": sid, "limit": 2})
    assert [s["snapshotID"] for s in r.json()] == ids[::-1][:2] and r.headers["x-next-token"]
    r = await client.get("/snapshots", params={"sandboxID": sid, "limit": 2,
                                               "nextToken": r.headers["x-next-token"]})
    assert [s["snapshotID"] for s in r.json()] == [ids[0]] and "x-next-token" not in r.headers
    r = await client.get("/snapshots", params={"name": "one"})
    assert [s["snapshotID"] for s in r.json()] == [ids[2], ids[0]]
    assert (await client.get("/snapshots", params={"sandboxID": "other"})).json() == []
    assert_error(await client.get("/snapshots", params={"nextToken": "!!"}), 400)
    # a snapshot id (or name) is a templateID
    child = await create(client, templateID=ids[1])
    assert child["templateID"] == ids[1]
    assert (await create(client, templateID="one"))["templateID"] == ids[2]
    # delete: 204 at once, then gone; 404 for unknown; a template is not deleted here
    r = await client.delete(f"/templates/{ids[1]}")
    assert r.status_code == 204 and r.content == b""
    assert ids[1] not in [s["snapshotID"] for s in (await client.get("/snapshots")).json()]
    assert_error(await client.delete(f"/templates/{ids[1]}"), 404)
    assert_error(await client.post("/v2/sandboxes", json={"templateID": ids[1]}), 404)
    assert_error(await client.delete("/templates/team%2Fname%3Atag"), 404)
    assert_error(await client.delete("/templates/base"), 400)
    # the sandbox created from it keeps running
    assert (await client.get(f"/sandboxes/{child['sandboxID']}")).json()["state"] == "running"
    # a paused sandbox cannot be snapshotted
    await client.post(f"/sandboxes/{sid}/pause")
    assert_error(await client.post(f"/sandboxes/{sid}/snapshots"), 409)


async def test_fork_answers_one_entry_per_child(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    src = await create(client, metadata={"m": "1"}, envVars={"FOO": "bar"})
    sid = src["sandboxID"]
    assert_error(await client.post("/sandboxes/nope/fork", json={}), 404)
    r = await client.post(f"/sandboxes/{sid}/fork", json={})
    assert r.status_code == 201 and len(r.json()) == 1 and "sandbox" in r.json()[0]
    runtime.fail_next_create = RuntimeError_("no luck")
    r = await client.post(f"/sandboxes/{sid}/fork", json={"count": 3, "timeout": 60})
    assert r.status_code == 201
    out = r.json()
    assert out[0] == {"error": {"code": 500, "message": "no luck"}}
    kids = [o["sandbox"] for o in out[1:]]
    assert len({k["sandboxID"] for k in kids} | {sid}) == 3
    assert len({k["envdAccessToken"] for k in kids} | {src["envdAccessToken"]}) == 3
    for k in kids:
        info = (await client.get(f"/sandboxes/{k['sandboxID']}")).json()
        assert info["metadata"] == {"m": "1"} and info["state"] == "running"
    for bad in ({"count": 0}, {"count": 21}, {"count": "2"}, {"timeout": -1}):
        assert_error(await client.post(f"/sandboxes/{sid}/fork", json=bad), 400)


@pytest.mark.parametrize("config_kw", [{"disk_reserve_mib": 1 << 40}])
async def test_space_admission_is_507(tmp_path, config_kw) -> None:  # type: ignore[no-untyped-def]
    from .conftest import KEY, make_config

    node = Node(make_config(tmp_path, **config_kw), FakeRuntime())
    await node.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=node),
                                     base_url="http://aenv", headers={"X-API-Key": KEY}) as c:
            assert_error(await c.post("/v2/sandboxes", json={"templateID": "base"}), 507,
                         "free space")  # fmt: skip
            assert node.orchestrator.store.all() == []
    finally:
        await node.close()


async def test_a_named_snapshot_forks_into_children_and_a_paused_sandbox_forks(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    src = await create(client)
    sid = src["sandboxID"]
    snap = (await client.post(f"/sandboxes/{sid}/snapshots", json={"name": "task-7"})).json()
    for name in (snap["snapshotID"], "task-7"):
        r = await client.post(f"/snapshots/{name}/fork", json={"count": 3, "timeout": 60})
        assert r.status_code == 201, r.text
        kids = [o["sandbox"] for o in r.json()]
        assert len({k["sandboxID"] for k in kids}) == 3
        assert len({k["envdAccessToken"] for k in kids}) == 3
        for k in kids:
            info = (await client.get(f"/sandboxes/{k['sandboxID']}")).json()
            assert info["state"] == "running" and info["templateID"] == snap["snapshotID"]
    assert_error(await client.post("/snapshots/nope/fork", json={}), 404)
    for bad in ({"count": 0}, {"count": 21}, {"timeout": -1}):
        assert_error(await client.post(f"/snapshots/{snap['snapshotID']}/fork", json=bad), 400)
    # A paused source forks (aenv; E2B answers 409) and stays paused, with its tier shown.
    assert (await client.post(f"/sandboxes/{sid}/pause")).status_code == 204
    r = await client.post(f"/sandboxes/{sid}/fork", json={"count": 2})
    assert r.status_code == 201 and all("sandbox" in o for o in r.json()), r.text
    info = (await client.get(f"/sandboxes/{sid}")).json()
    assert info["state"] == "paused" and info["pauseTier"] == "cold"
