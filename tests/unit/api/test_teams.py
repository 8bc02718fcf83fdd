"""Teams and keys through the API on the fake runtime: the admin routes, isolation (another
team's sandbox is a 404), per-team limits (429, not to be retried) and revocation at once."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from aenv.api.app import Node
from aenv.orchestrator.fake import FakeRuntime
from aenv.teams.model import DEFAULT_TEAM, Team
from aenv.teams.store import TeamStore

from .conftest import KEY
from .test_control_plane import assert_error


@pytest.fixture
async def admin(node: Node) -> AsyncIterator[httpx.AsyncClient]:
    async with _as(node, KEY) as c:
        yield c


def _as(node: Node, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=node), base_url="http://aenv",
                             headers={"X-API-Key": key})  # fmt: skip


async def _team_key(admin: httpx.AsyncClient, name: str, **limits: object) -> str:
    r = await admin.post("/admin/teams", json={"name": name, **limits})
    assert r.status_code == 201, r.text
    assert r.json()["usage"] == {"sandboxes": 0, "memoryMB": 0}
    r = await admin.post("/admin/keys", json={"team": name, "name": "ci"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["key"].startswith("aenv_") and body["mask"] in (
        f"{body['key'][:7]}…{body['key'][-4:]}",) and not body["admin"]
    return str(body["key"])


async def _create(c: httpx.AsyncClient, **body: object) -> httpx.Response:
    return await c.post("/v2/sandboxes", json={"templateID": "base", **body})


async def test_another_teams_sandbox_is_not_found_by_any_route(
        node: Node, admin: httpx.AsyncClient) -> None:  # fmt: skip
    blue_key = await _team_key(admin, "blue")
    async with _as(node, blue_key) as blue:
        r = await _create(blue)
        assert r.status_code == 201, r.text
        mine = r.json()["sandboxID"]
        theirs = (await _create(admin)).json()["sandboxID"]
        for c, own, other in ((blue, mine, theirs), (admin, theirs, mine)):
            assert [s["sandboxID"] for s in (await c.get("/v2/sandboxes")).json()] == [own]
            assert [s["sandboxID"] for s in (await c.get("/sandboxes")).json()] == [own]
            assert (await c.get(f"/sandboxes/{own}")).status_code == 200
            for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/pause"),
                                 ("POST", "/timeout"), ("POST", "/connect"),
                                 ("GET", "/logs"), ("GET", "/v2/logs"), ("GET", "/metrics"),
                                 ("POST", "/fork"), ("POST", "/snapshots")):  # fmt: skip
                url = (f"/v2/sandboxes/{other}/logs" if path == "/v2/logs"
                       else f"/sandboxes/{other}{path}")
                r = await c.request(method, url, json={"timeout": 30})
                assert_error(r, 404, "doesn't exist")
        # Nothing of theirs changed: the other team's sandbox still runs.
        assert (await admin.get(f"/sandboxes/{theirs}")).json()["state"] == "running"
        r = await blue.post(f"/sandboxes/{mine}/fork", json={"count": 2})
        assert r.status_code == 201, r.text
        kids = [k["sandbox"]["sandboxID"] for k in r.json() if "sandbox" in k]
        assert len(kids) == 2
        listed = {s["sandboxID"] for s in (await blue.get("/v2/sandboxes")).json()}
        assert listed == {mine, *kids}  # a fork's children are its team's
        assert (await admin.get(f"/sandboxes/{kids[0]}")).status_code == 404


async def test_an_ended_sandboxs_log_stays_its_teams(
        node: Node, admin: httpx.AsyncClient) -> None:  # fmt: skip
    key = await _team_key(admin, "grey")
    async with _as(node, key) as grey:
        sid = (await _create(grey)).json()["sandboxID"]
        assert (await grey.delete(f"/sandboxes/{sid}")).status_code == 204
        for url in (f"/sandboxes/{sid}/logs", f"/v2/sandboxes/{sid}/logs"):
            r = await grey.get(url)
            assert r.status_code == 200 and "sandbox.killed" in r.text, r.text
            assert_error(await admin.get(url), 404, "not found")


async def test_a_team_over_its_limits_gets_429_that_says_not_to_retry(
        node: Node, admin: httpx.AsyncClient) -> None:  # fmt: skip
    key = await _team_key(admin, "small", maxSandboxes=2, maxMemoryMB=1024)
    async with _as(node, key) as small:
        a = (await _create(small, memoryMB=512)).json()["sandboxID"]
        r = await _create(small, memoryMB=1024)
        assert_error(r, 429, "may use 1024 MiB")
        assert r.headers["should-retry"] == "false" and "retry-after" not in r.headers
        b = (await _create(small, memoryMB=512)).json()["sandboxID"]
        r = await _create(small, memoryMB=512)
        assert_error(r, 429, "may run 2 sandboxes at once and runs 2")
        assert r.headers["should-retry"] == "false"
        assert_error(await small.post(f"/sandboxes/{a}/fork", json={"count": 1}), 429)
        assert (await _create(admin)).status_code == 201  # other teams are not held back
        t = (await admin.get("/admin/teams/small")).json()
        assert t["usage"] == {"sandboxes": 2, "memoryMB": 1024}
        # A paused sandbox holds nothing; its resume is admitted like a create.
        assert (await small.post(f"/sandboxes/{b}/pause")).status_code == 204
        assert (await _create(small, memoryMB=512)).status_code == 201
        assert_error(await small.post(f"/sandboxes/{b}/resume", json={}), 429, "small")
        r = await admin.patch("/admin/teams/small", json={"maxSandboxes": None})
        assert r.status_code == 200 and r.json()["maxSandboxes"] is None
        assert r.json()["maxMemoryMB"] == 1024  # left as it was
        r = await admin.patch("/admin/teams/small", json={"maxMemoryMB": None})
        assert (await small.post(f"/sandboxes/{b}/resume", json={})).status_code == 201


async def test_a_revoked_key_is_refused_from_the_next_request(
        node: Node, admin: httpx.AsyncClient, config: object) -> None:  # fmt: skip
    key = await _team_key(admin, "red")
    keys = (await admin.get("/admin/keys", params={"team": "red"})).json()
    assert [k["name"] for k in keys] == ["ci"] and "key" not in keys[0]
    async with _as(node, key) as red:
        assert (await red.get("/v2/sandboxes")).status_code == 200
        assert_error(await red.get("/admin/teams"), 403, "not an admin key")
        assert_error(await red.post("/admin/keys", json={"team": "red", "admin": True}), 403)
        r = await admin.delete(f"/admin/keys/{keys[0]['keyID']}")
        assert r.status_code == 204
        assert_error(await red.get("/v2/sandboxes"), 401, "Invalid API key")
        assert_error(await red.post("/v2/sandboxes", content=b"{bad"), 401)
    after = (await admin.get("/admin/keys", params={"team": "red"})).json()
    assert after[0]["revokedAt"] is not None
    # Keys are kept as hashes only.
    db = sqlite3.connect(node.config.db_path)
    try:
        dump = "\n".join(db.iterdump())
    finally:
        db.close()
    assert key not in dump and KEY not in dump


async def test_a_teams_own_image_registries_replace_the_nodes_for_it(
        node: Node, admin: httpx.AsyncClient) -> None:  # fmt: skip
    """Set at creation, changed, emptied (it may pull nothing) and given back to the node's
    list (null); kept in the node's database across a restart of its team store."""
    r = await admin.post("/admin/teams", json={"name": "pulls", "imageRegistries":
                                               ["ghcr.io/org", "127.0.0.1", "ghcr.io/org"]})
    assert r.status_code == 201 and r.json()["imageRegistries"] == ["ghcr.io/org", "127.0.0.1"]
    assert (await admin.get("/admin/teams/default")).json()["imageRegistries"] is None
    r = await admin.patch("/admin/teams/pulls", json={"maxSandboxes": 3})
    assert r.json()["imageRegistries"] == ["ghcr.io/org", "127.0.0.1"]  # left as it was
    r = await admin.patch("/admin/teams/pulls", json={"imageRegistries": []})
    assert r.status_code == 200 and r.json()["imageRegistries"] == []
    tid = r.json()["teamID"]
    assert node._team_registries(tid) == ()  # what its creates and builds are checked against
    r = await admin.patch("/admin/teams/pulls", json={"imageRegistries": None})
    assert r.json()["imageRegistries"] is None and node._team_registries(tid) is None
    await admin.patch("/admin/teams/pulls", json={"imageRegistries": ["*"]})
    assert TeamStore(node.orchestrator.store.db).team("pulls").image_registries == ("*",)


async def test_a_teams_table_from_before_image_registries_is_given_the_column(
        tmp_path: Path) -> None:  # fmt: skip
    db = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    db.execute("CREATE TABLE teams (team_id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, "
               "max_sandboxes INTEGER, max_memory_mib INTEGER, created_us INTEGER NOT NULL)")
    db.execute("INSERT INTO teams VALUES ('t1', 'old', 4, NULL, 1)")
    store = TeamStore(db)
    assert store.team("old") == Team("t1", "old", 4, None, 1, None)
    await store.set_limits("old", image_registries=["docker.io"])
    assert store.team("t1").image_registries == ("docker.io",)
    assert {t.name for t in store.teams()} == {"old", DEFAULT_TEAM}


async def test_an_admin_key_of_another_team_manages_teams(
        node: Node, admin: httpx.AsyncClient) -> None:  # fmt: skip
    await admin.post("/admin/teams", json={"name": "ops"})
    r = await admin.post("/admin/keys", json={"team": "ops", "admin": True})
    async with _as(node, r.json()["key"]) as ops:
        assert (await ops.post("/admin/teams", json={"name": "green"})).status_code == 201
        names = [t["name"] for t in (await ops.get("/admin/teams")).json()]
        assert names == ["default", "ops", "green"]


@pytest.mark.parametrize(("method", "path", "body", "status", "text"), [
    ("POST", "/admin/teams", {"name": "Bad Name"}, 400, "team name"),
    ("POST", "/admin/teams", {"name": "default"}, 409, "exists"),
    ("POST", "/admin/teams", {"name": "x", "maxSandboxes": -1}, 400, "maxSandboxes"),
    ("POST", "/admin/teams", {"name": "x", "maxSandboxes": True}, 400, "maxSandboxes"),
    ("POST", "/admin/teams", {"name": "x", "extra": 1}, 400, "extra"),
    ("PATCH", "/admin/teams/nope", {"maxSandboxes": 1}, 404, "not found"),
    ("PATCH", "/admin/teams/default", {"maxMemoryMB": -5}, 400, "maxMemoryMB"),
    ("DELETE", "/admin/teams/default", None, 400, "default team"),
    ("DELETE", "/admin/teams/nope", None, 404, "not found"),
    ("POST", "/admin/keys", {"team": "nope"}, 404, "not found"),
    ("POST", "/admin/keys", {"team": "default", "name": "a b"}, 400, "key name"),
    ("DELETE", "/admin/keys/node", None, 400, "AENV_API_KEY"),
    ("DELETE", "/admin/keys/key_0000", None, 404, "not found"),
    ("GET", "/admin/keys?team=nope", None, 404, "not found"),
    ("POST", "/admin/teams", {"name": "x", "imageRegistries": "ghcr.io"}, 400, "imageRegistries"),
    ("POST", "/admin/teams", {"name": "x", "imageRegistries": ["a b"]}, 400, "imageRegistries"),
    ("PATCH", "/admin/teams/default", {"imageRegistries": ["https://x.io"]}, 400,
     "imageRegistries"),
    ("PATCH", "/admin/teams/default", {"imageRegistries": ["x.io"] * 65}, 400, "up to 64"),
])  # fmt: skip
async def test_bad_admin_requests_get_clear_errors(
        admin: httpx.AsyncClient, method: str, path: str, body: object, status: int,
        text: str) -> None:  # fmt: skip
    r = await admin.request(method, path, json=body)
    assert_error(r, status, text)


async def test_a_team_that_owns_sandboxes_is_not_deleted(
        node: Node, admin: httpx.AsyncClient) -> None:  # fmt: skip
    key = await _team_key(admin, "temp")
    async with _as(node, key) as temp:
        sid = (await _create(temp)).json()["sandboxID"]
        assert_error(await admin.delete("/admin/teams/temp"), 409, "1 sandbox")
        assert (await temp.delete(f"/sandboxes/{sid}")).status_code == 204
    assert (await admin.delete("/admin/teams/temp")).status_code == 204
    assert_error(await admin.get("/admin/teams/temp"), 404)
    async with _as(node, key) as temp:  # its keys went with it
        assert_error(await temp.get("/v2/sandboxes"), 401)


async def test_volumes_are_the_teams_own_and_names_are_per_team(
        node: Node, admin: httpx.AsyncClient) -> None:  # fmt: skip
    key = await _team_key(admin, "vols")
    async with _as(node, key) as other:
        mine = (await admin.post("/volumes", json={"name": "data"})).json()
        theirs = (await other.post("/volumes", json={"name": "data"})).json()  # no clash
        assert theirs["volumeID"] != mine["volumeID"]
        for c, own, foreign in ((admin, mine, theirs), (other, theirs, mine)):
            assert [v["volumeID"] for v in (await c.get("/volumes")).json()] == [own["volumeID"]]
            assert (await c.get("/volumes/data")).json()["volumeID"] == own["volumeID"]
            assert_error(await c.get(f"/volumes/{foreign['volumeID']}"), 404, "not found")
            assert_error(await c.delete(f"/volumes/{foreign['volumeID']}"), 404)
            r = await _create(c, volumeMounts=[{"name": foreign["volumeID"], "path": "/mnt/d"}])
            assert_error(r, 404, "not found")
            r = await _create(c, volumeMounts=[{"name": "data", "path": "/mnt/d"}])
            assert r.status_code == 201, r.text
            sid = r.json()["sandboxID"]
            rec = node.orchestrator.get(sid)
            assert [v for _, _, v in rec.volume_mounts] == [own["volumeID"]]
            # Mounted by its own team's sandbox only: the other's delete is not blocked by it.
            assert (await c.delete(f"/sandboxes/{sid}")).status_code == 204
        assert_error(await admin.delete("/admin/teams/vols"), 409, "1 volume")
        assert (await other.delete("/volumes/data")).status_code == 204
        assert (await admin.get("/volumes/data")).status_code == 200  # the other one stays
    assert (await admin.delete("/admin/teams/vols")).status_code == 204


async def test_templates_and_snapshots_are_per_team_and_public_ones_are_everyones(
        node: Node, admin: httpx.AsyncClient, runtime: FakeRuntime) -> None:  # fmt: skip
    key = await _team_key(admin, "tpl")
    team = (await admin.get("/admin/teams/tpl")).json()["teamID"]
    base = runtime.template("base")
    # A template of the team's named "py", and a public one of the same name.
    runtime._templates += [dataclasses.replace(base, template_id=f"py~{team}", aliases=[],
                                               build_id="b-team"),
                           dataclasses.replace(base, template_id="py", aliases=[],
                                               build_id="b-public")]  # fmt: skip
    async with _as(node, key) as other:
        listed = {t["templateID"]: t for t in (await other.get("/templates")).json()}
        assert set(listed) == {"base", "py"} and listed["py"]["buildID"] == "b-team"
        assert not listed["py"]["public"] and listed["base"]["public"]
        assert (await other.get("/templates/py")).json()["buildID"] == "b-team"
        assert (await admin.get("/templates/py")).json()["buildID"] == "b-public"
        assert (await other.get("/templates/aliases/py")).json() == {"templateID": "py",
                                                                      "public": False}
        for name in ("nope", f"py~{team}x", f"base~{team}"):
            assert_error(await other.get(f"/templates/aliases/{name}"), 404)
        assert_error(await admin.get(f"/templates/py~{team}"), 404)  # not the admin's either
        r = await _create(other, templateID="py")
        assert r.status_code == 201 and r.json()["templateID"] == "py", r.text
        sid = r.json()["sandboxID"]
        assert node.orchestrator.get(sid).template_id == f"py~{team}"
        listed = (await other.get("/v2/sandboxes", params={"template": "py"})).json()
        assert [s["sandboxID"] for s in listed] == [sid] and listed[0]["templateID"] == "py"
        assert_error(await other.delete("/templates/base"), 403, "public")

        snap = (await other.post(f"/sandboxes/{sid}/snapshots", json={"name": "step"})).json()
        assert [s["snapshotID"] for s in (await other.get("/snapshots")).json()] == [
            snap["snapshotID"]]
        assert (await admin.get("/snapshots")).json() == []
        for ref in (snap["snapshotID"], "step"):
            assert_error(await _create(admin, templateID=ref), 404)
            assert_error(await admin.post(f"/snapshots/{ref}/fork", json={"count": 1}), 404)
            assert_error(await admin.delete(f"/templates/{ref}"), 404)
        r = await _create(other, templateID="step")
        assert r.status_code == 201, r.text
        assert (await other.delete(f"/templates/{snap['snapshotID']}")).status_code == 204
        assert (await other.delete("/templates/py")).status_code == 204  # its own
        assert (await admin.get("/templates/py")).json()["buildID"] == "b-public"


async def test_secrets_are_per_team_and_rules_name_only_the_teams_own(
        node: Node, admin: httpx.AsyncClient) -> None:  # fmt: skip
    key = await _team_key(admin, "sec")
    async with _as(node, key) as other:
        mine = (await admin.post("/secrets", json={"name": "api", "value": "v-admin"})).json()
        theirs = (await other.post("/secrets", json={"name": "api", "value": "v-other"})).json()
        assert mine["secretID"] != theirs["secretID"]  # one name, two teams
        assert [s["secretID"] for s in (await other.get("/secrets")).json()] == [
            theirs["secretID"]]
        assert_error(await other.get(f"/secrets/{mine['secretID']}"), 404)
        assert_error(await other.delete(f"/secrets/{mine['secretID']}"), 404)
        only = (await admin.post("/secrets", json={"name": "admin-only", "value": "x"})).json()
        rules = {"api.example.com": [{"transform": {"headers": {
            "Authorization": "Bearer ${e2b.secrets.admin-only}"}}}]}
        r = await _create(other, network={"rules": rules})
        assert_error(r, 400, "'admin-only' does not exist")  # another team's is not there
        assert (await _create(admin, network={"rules": rules})).status_code == 201
        store = node.orchestrator.secrets
        assert store is not None
        assert await store.value(DEFAULT_TEAM, "api") == "v-admin"
        assert await store.value((await admin.get("/admin/teams/sec")).json()["teamID"],
                                 "api") == "v-other"  # fmt: skip
        assert_error(await admin.delete("/admin/teams/sec"), 409, "1 secret")
        assert (await other.delete("/secrets/api")).status_code == 204
        assert (await admin.get(f"/secrets/{only['secretID']}")).status_code == 200


async def test_traffic_that_would_wake_a_sandbox_past_its_teams_limit_gets_429(
        node: Node, admin: httpx.AsyncClient) -> None:  # fmt: skip
    """autoResume is a resume: past the team's limit the data plane says why (429), and
    the sandbox stays paused; within it, the request wakes it."""
    key = await _team_key(admin, "one", maxSandboxes=1)
    async with _as(node, key) as one:
        r = await _create(one, autoPause=True, autoResume={"enabled": True})
        a = r.json()
        assert (await one.post(f"/sandboxes/{a['sandboxID']}/pause")).status_code == 204
        b = (await _create(one)).json()["sandboxID"]
        traffic = {"E2b-Sandbox-Id": a["sandboxID"], "E2b-Sandbox-Port": "49983",
                   "X-Access-Token": a["envdAccessToken"]}  # fmt: skip
        r = await one.get("/health", headers=traffic)
        assert_error(r, 429, "team 'one' may run 1 sandboxes at once")
        assert (await one.get(f"/sandboxes/{a['sandboxID']}")).json()["state"] == "paused"
        assert (await one.delete(f"/sandboxes/{b}")).status_code == 204
        r = await one.get("/health", headers=traffic)
        assert r.status_code != 429, r.text  # woken (nothing listens in a fake VM)
        assert (await one.get(f"/sandboxes/{a['sandboxID']}")).json()["state"] == "running"
