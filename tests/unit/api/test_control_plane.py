from __future__ import annotations

import asyncio
import os
import stat
import time
from pathlib import Path

import httpx
import pytest
from dateutil.parser import isoparse

from aenv.api.app import MAX_CONTROL_BODY, Node
from aenv.api.auth import resolve_api_key
from aenv.orchestrator.fake import FakeRuntime

from .conftest import KEY, make_config


def assert_error(r: httpx.Response, status: int, text: str = "") -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"code", "message"} and body["code"] == status, body
    assert isinstance(body["message"], str) and text in body["message"], body


async def create(client: httpx.AsyncClient, **body: object) -> dict:
    r = await client.post("/v2/sandboxes", json={"templateID": "base", **body})
    assert r.status_code == 201, r.text
    return r.json()


# -- auth ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2/sandboxes"), ("POST", "/sandboxes"), ("GET", "/sandboxes"),
        ("GET", "/v2/sandboxes"), ("GET", "/sandboxes/x"), ("DELETE", "/sandboxes/x"),
        ("POST", "/sandboxes/x/timeout"), ("POST", "/sandboxes/x/refreshes"),
        ("POST", "/v2/sandboxes/x/connect"), ("POST", "/sandboxes/x/connect"),
        ("GET", "/sandboxes/x/metrics"), ("GET", "/sandboxes/metrics"), ("GET", "/templates"),
        ("GET", "/templates/aliases/base"), ("POST", "/sandboxes/x/pause"),
        ("POST", "/sandboxes/x/resume"), ("POST", "/sandboxes/x/fork"),
        ("POST", "/sandboxes/x/snapshots"), ("GET", "/snapshots"), ("DELETE", "/templates/x"),
    ],
)  # fmt: skip
async def test_every_control_call_needs_the_key(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    for headers in ({"X-API-Key": ""}, {"X-API-Key": "wrong"}, {"X-API-Key": KEY + "x"}):
        r = await client.request(method, path, headers=headers, json={"templateID": "base"})
        assert_error(r, 401)
    r = await client.request(method, path, headers={"X-API-Key": "wrong"}, content=b"{bad")
    assert_error(r, 401)  # auth is decided before the body is looked at


async def test_health_openapi_and_prometheus_need_no_key(client: httpx.AsyncClient) -> None:
    anon = {"X-API-Key": ""}
    r = await client.get("/health", headers=anon)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert r.json()["accelerator"] in (None, "kvm", "tcg")  # the fake runtime has none
    r = await client.get("/openapi.json", headers=anon)
    assert r.status_code == 200
    doc = r.json()
    assert "/v2/sandboxes" in doc["paths"] and "/sandboxes/{sandbox_id}/metrics" in doc["paths"]
    assert doc["components"]["securitySchemes"]["APIKeyHeader"]["name"] == "X-API-Key"
    await create(client)
    r = await client.get("/metrics", headers=anon)
    assert r.status_code == 200 and 'aenv_sandboxes{state="running"} 1.0' in r.text


async def test_generated_key_is_private_and_stable(tmp_path: Path) -> None:
    config = make_config(tmp_path, api_key=None)
    key = resolve_api_key(config)
    path = config.data_dir / "api_key"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert resolve_api_key(config) == key and key.startswith("aenv_")
    node = Node(config, FakeRuntime())
    assert node.api_key == key


# -- errors ----------------------------------------------------------------------------------


async def test_unknown_routes_and_methods_are_json(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/nope"), 404)
    assert_error(await client.get("/v3/sandboxes"), 404)
    assert_error(await client.put("/v2/sandboxes"), 405)


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b"{bad json", "not valid JSON"),
        (b"", "required"),
        (b"[]", ""),
        (b'{"templateID": 5}', "templateID"),
        (b'{"templateID": ""}', "templateID"),
        (b'{"templateID": "base", "timeout": "30"}', "timeout"),
        (b'{"templateID": "base", "timeout": 1.5}', "timeout"),
        (b'{"templateID": "base", "timeout": true}', "timeout"),
        (b'{"templateID": "base", "timeout": -1}', "timeout"),
        (b'{"templateID": "base", "timeout": 99999999999}', "timeout"),
        (b'{"templateID": "base", "metadata": {"a": 1}}', "metadata"),
        (b'{"templateID": "base", "metadata": []}', "metadata"),
        (b'{"templateID": "base", "envVars": "x"}', "envVars"),
        (b'{"templateID": "base", "autoPause": "yes"}', "autoPause"),
        (b'{"templateID": "base", "autoResume": {"enabled": true}}', "autoResume"),
        (b'{"templateID": "base", "cpuCount": 0}', "cpuCount"),
        (b'{"templateID": "base", "memoryMB": 10}', "memoryMB"),
        (b'{"templateID": "base", "allow_internet_access": "no"}', "allow_internet_access"),
    ],
)
async def test_bad_create_bodies_are_400(
    client: httpx.AsyncClient, node: Node, body: bytes, text: str
) -> None:
    for path in ("/v2/sandboxes", "/sandboxes"):
        r = await client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert_error(r, 400, text)
    assert node.orchestrator.store.all() == []


async def test_unknown_template_is_404(client: httpx.AsyncClient) -> None:
    r = await client.post("/v2/sandboxes", json={"templateID": "no-such-template"})
    assert_error(r, 404, "no-such-template")


async def test_huge_bodies_are_413(client: httpx.AsyncClient, node: Node) -> None:
    big = b'{"templateID":"base","metadata":{"k":"' + b"x" * MAX_CONTROL_BODY + b'"}}'
    assert_error(await client.post("/v2/sandboxes", content=big), 413)

    async def chunks():  # no Content-Length: chunked
        for _ in range(MAX_CONTROL_BODY // 65536 + 2):
            yield b" " * 65536

    assert_error(await client.post("/v2/sandboxes", content=chunks()), 413)
    assert node.orchestrator.store.all() == []


async def test_chunked_small_body_works(client: httpx.AsyncClient) -> None:
    async def chunks():
        yield b'{"templateID":'
        yield b'"base"}'

    r = await client.post("/v2/sandboxes", content=chunks())
    assert r.status_code == 201, r.text


async def test_body_without_json_content_type_is_still_json(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v2/sandboxes", content=b'{"templateID":"base"}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )  # fmt: skip
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("sid", ["nope", "a" * 20, "x%2Fy", "%00", "A" * 300, "ü"])
async def test_ids_that_name_nothing_are_404(client: httpx.AsyncClient, sid: str) -> None:
    assert_error(await client.get(f"/sandboxes/{sid}"), 404)
    assert_error(await client.delete(f"/sandboxes/{sid}"), 404)
    assert_error(await client.post(f"/sandboxes/{sid}/timeout", json={"timeout": 5}), 404)
    assert_error(await client.post(f"/v2/sandboxes/{sid}/connect", json={}), 404)
    assert_error(await client.get(f"/sandboxes/{sid}/metrics"), 404)
    assert_error(await client.post(f"/sandboxes/{sid}/refreshes"), 404)
    assert_error(await client.post(f"/sandboxes/{sid}/pause"), 404)


# -- lifecycle -------------------------------------------------------------------------------


async def test_create_v2_answers_the_sandbox_model(client: httpx.AsyncClient) -> None:
    r = await client.post("/v2/sandboxes", json={"templateID": "base"})
    assert r.status_code == 201
    body = r.json()
    assert set(body) >= {"templateID", "sandboxID", "clientID", "envdVersion",
                         "envdAccessToken", "domain", "alias"}  # fmt: skip
    assert body["templateID"] == "base" and body["envdVersion"] == "0.6.4"
    assert body["domain"] is None and len(body["sandboxID"]) == 20


async def test_v2_is_always_secure_v1_can_opt_out(client: httpx.AsyncClient) -> None:
    r = await client.post("/v2/sandboxes", json={"templateID": "base", "secure": False})
    assert r.json()["envdAccessToken"]
    r = await client.post("/sandboxes", json={"templateID": "base", "secure": False})
    assert r.status_code == 201 and "envdAccessToken" not in r.json()
    sid = r.json()["sandboxID"]
    assert "envdAccessToken" not in (await client.get(f"/sandboxes/{sid}")).json()


async def test_default_timeouts_v2_300_v1_15(client: httpx.AsyncClient) -> None:
    for path, expect in (("/v2/sandboxes", 300), ("/sandboxes", 15)):
        sid = (await client.post(path, json={"templateID": "base"})).json()["sandboxID"]
        info = (await client.get(f"/sandboxes/{sid}")).json()
        ttl = (isoparse(info["endAt"]) - isoparse(info["startedAt"])).total_seconds()
        assert expect <= ttl < expect + 5


async def test_get_info_has_every_required_field(client: httpx.AsyncClient) -> None:
    sb = await create(client, metadata={"suite": "x"}, envVars={"A": "1"}, cpuCount=2,
                      memoryMB=1024)  # fmt: skip
    r = await client.get(f"/sandboxes/{sb['sandboxID']}")
    assert r.status_code == 200
    info = r.json()
    for k in ("templateID", "sandboxID", "clientID", "startedAt", "endAt", "envdVersion",
              "cpuCount", "memoryMB", "diskSizeMB", "state"):  # fmt: skip
        assert k in info, k
    assert info["state"] == "running" and info["metadata"] == {"suite": "x"}
    assert (info["cpuCount"], info["memoryMB"]) == (2, 1024)
    assert info["envdAccessToken"] == sb["envdAccessToken"]
    assert info["lifecycle"] == {"onTimeout": "kill", "autoResume": False}
    assert isoparse(info["startedAt"]).tzinfo is not None
    assert "envVars" not in info


async def test_kill_then_everything_is_404(client: httpx.AsyncClient) -> None:
    sid = (await create(client))["sandboxID"]
    r = await client.delete(f"/sandboxes/{sid}")
    assert r.status_code == 204 and r.content == b""
    assert_error(await client.delete(f"/sandboxes/{sid}"), 404)
    assert_error(await client.get(f"/sandboxes/{sid}"), 404)
    assert_error(await client.post(f"/sandboxes/{sid}/timeout", json={"timeout": 5}), 404)
    assert_error(await client.post(f"/v2/sandboxes/{sid}/connect", json={}), 404)
    assert sid not in [s["sandboxID"] for s in (await client.get("/v2/sandboxes")).json()]


async def test_set_timeout_sets_and_validates(client: httpx.AsyncClient) -> None:
    sid = (await create(client))["sandboxID"]
    before = isoparse((await client.get(f"/sandboxes/{sid}")).json()["endAt"])
    r = await client.post(f"/sandboxes/{sid}/timeout", json={"timeout": 600})
    assert r.status_code == 204 and r.content == b""
    after = isoparse((await client.get(f"/sandboxes/{sid}")).json()["endAt"])
    assert after > before
    r = await client.post(f"/sandboxes/{sid}/timeout", json={"timeout": 10})
    shorter = isoparse((await client.get(f"/sandboxes/{sid}")).json()["endAt"])
    assert shorter < after
    for bad in ({}, {"timeout": -5}, {"timeout": "x"}, {"timeout": 10**12}):
        assert_error(await client.post(f"/sandboxes/{sid}/timeout", json=bad), 400)


async def test_timeout_expiry_kills(client: httpx.AsyncClient, runtime: FakeRuntime) -> None:
    sid = (await create(client))["sandboxID"]
    await client.post(f"/sandboxes/{sid}/timeout", json={"timeout": 0})
    t0 = time.monotonic()
    while (await client.get(f"/sandboxes/{sid}")).status_code != 404:
        assert time.monotonic() - t0 < 2
        await asyncio.sleep(0.02)
    assert sid in runtime.killed


async def test_connect_extends_only_and_answers_200(client: httpx.AsyncClient) -> None:
    sb = await create(client, timeout=300)
    sid = sb["sandboxID"]
    end0 = (await client.get(f"/sandboxes/{sid}")).json()["endAt"]
    for path in (f"/v2/sandboxes/{sid}/connect", f"/sandboxes/{sid}/connect"):
        r = await client.post(path, json={"timeout": 10})
        assert r.status_code == 200
        assert r.json()["sandboxID"] == sid
        assert r.json()["envdAccessToken"] == sb["envdAccessToken"]
        assert (await client.get(f"/sandboxes/{sid}")).json()["endAt"] == end0
    r = await client.post(f"/v2/sandboxes/{sid}/connect")  # no body: 300 s
    assert r.status_code == 200
    r = await client.post(f"/v2/sandboxes/{sid}/connect", json={"timeout": 900})
    end1 = (await client.get(f"/sandboxes/{sid}")).json()["endAt"]
    assert isoparse(end1) > isoparse(end0)
    assert_error(await client.post(f"/v2/sandboxes/{sid}/connect", json={"timeout": -1}), 400)


async def test_refreshes_extend(client: httpx.AsyncClient) -> None:
    sid = (await create(client, timeout=10))["sandboxID"]
    end0 = isoparse((await client.get(f"/sandboxes/{sid}")).json()["endAt"])
    r = await client.post(f"/sandboxes/{sid}/refreshes", json={"duration": 60})
    assert r.status_code == 204
    assert isoparse((await client.get(f"/sandboxes/{sid}")).json()["endAt"]) > end0
    assert (await client.post(f"/sandboxes/{sid}/refreshes")).status_code == 204
    assert_error(await client.post(f"/sandboxes/{sid}/refreshes", json={"duration": 4000}), 400)




# -- listing ---------------------------------------------------------------------------------


async def test_v2_list_filters_orders_and_paginates(client: httpx.AsyncClient) -> None:
    a = (await create(client, metadata={"suite": "s1", "a b": "c&d"}))["sandboxID"]
    await asyncio.sleep(0.002)
    b = (await create(client, metadata={"suite": "s1"}))["sandboxID"]
    await asyncio.sleep(0.002)
    await create(client, metadata={"suite": "s2"})

    async def page(**params: object) -> tuple[list[str], str | None]:
        r = await client.get("/v2/sandboxes", params=params)
        assert r.status_code == 200, r.text
        return [s["sandboxID"] for s in r.json()], r.headers.get("x-next-token")

    # The SDK's encoding: quote each key/value, urlencode, then httpx encodes the param.
    from urllib.parse import quote, urlencode

    md = urlencode({quote("suite"): quote("s1")})
    ids, tok = await page(metadata=md)
    assert ids == [b, a] and tok is None
    ids, _ = await page(metadata=urlencode({quote("a b"): quote("c&d")}))
    assert ids == [a]
    ids, tok = await page(metadata=md, limit=1)
    assert ids == [b] and tok
    ids, tok = await page(metadata=md, limit=1, nextToken=tok)
    assert ids == [a] and not tok
    ids, _ = await page(metadata=md, order="asc")
    assert ids == [a, b]
    ids, _ = await page(metadata=md, state="running")
    assert ids == [b, a]
    ids, _ = await page(metadata=md, state="paused")
    assert ids == []
    info = (await client.get(f"/sandboxes/{a}")).json()
    ids, _ = await page(metadata=md, startedAfter=isoparse(info["startedAt"]).isoformat())
    assert a in ids
    later = (isoparse(info["startedAt"]).timestamp() + 1)
    from datetime import UTC, datetime

    ids, _ = await page(metadata=md, startedAfter=datetime.fromtimestamp(later, UTC).isoformat())
    assert a not in ids
    ids, _ = await page(metadata=md, template="base")
    assert ids == [b, a]
    ids, _ = await page(template="unknown-template")
    assert ids == []


@pytest.mark.parametrize(
    "params",
    [{"limit": 0}, {"limit": 101}, {"limit": "x"}, {"order": "sideways"}, {"state": "dead"},
     {"startedAfter": "nope"}, {"nextToken": "%%%"}, {"metadata": "novalue"}],
)  # fmt: skip
async def test_v2_list_bad_queries_are_400(client: httpx.AsyncClient, params: dict) -> None:
    assert_error(await client.get("/v2/sandboxes", params=params), 400)


async def test_v1_list_shows_running(client: httpx.AsyncClient) -> None:
    sid = (await create(client, metadata={"k": "v"}))["sandboxID"]
    r = await client.get("/sandboxes")
    assert r.status_code == 200 and [s["sandboxID"] for s in r.json()] == [sid]
    assert r.json()[0]["state"] == "running"


# -- metrics and templates -------------------------------------------------------------------


async def test_metrics_time_series(client: httpx.AsyncClient) -> None:
    sid = (await create(client))["sandboxID"]
    now = int(time.time())
    r = await client.get(f"/sandboxes/{sid}/metrics", params={"start": now - 10, "end": now + 10})
    assert r.status_code == 200
    [m] = r.json()
    assert set(m) == {"timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed",
                      "memTotal", "memCache", "diskUsed", "diskTotal"}  # fmt: skip
    assert isoparse(m["timestamp"]).timestamp() == pytest.approx(m["timestampUnix"], abs=1)
    r = await client.get(f"/sandboxes/{sid}/metrics", params={"start": 0, "end": now - 100})
    assert r.status_code == 200 and r.json() == []
    r = await client.get(f"/sandboxes/{sid}/metrics")
    assert r.status_code == 200 and len(r.json()) >= 1
    assert_error(await client.get(f"/sandboxes/{sid}/metrics", params={"start": 5, "end": 1}), 400)


async def test_metrics_of_several_sandboxes_at_once(client: httpx.AsyncClient) -> None:
    a, b = (await create(client))["sandboxID"], (await create(client))["sandboxID"]
    r = await client.get("/sandboxes/metrics", params={"sandbox_ids": f"{a},nope,{b},{a}"})
    assert r.status_code == 200, r.text
    got = r.json()["sandboxes"]
    assert set(got) == {a, b}  # an id that names no sandbox is left out
    assert set(got[a]) == {"timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed",
                           "memTotal", "memCache", "diskUsed", "diskTotal"}  # fmt: skip
    assert abs(got[b]["timestampUnix"] - time.time()) < 30
    for bad in ("", ",", ",".join(f"s{i}" for i in range(101))):
        assert_error(await client.get("/sandboxes/metrics", params={"sandbox_ids": bad}), 400)
    assert_error(await client.get("/sandboxes/metrics"), 400)


async def test_templates_and_aliases(client: httpx.AsyncClient) -> None:
    r = await client.get("/templates")
    assert r.status_code == 200
    [t] = r.json()
    assert t["templateID"] == "base" and t["aliases"] == ["base"] and t["envdVersion"]
    r = await client.get("/templates/aliases/base")
    assert r.status_code == 200 and r.json() == {"templateID": "base", "public": True}
    assert_error(await client.get("/templates/aliases/team%2Fname%3Atag"), 404, "team/name:tag")
    assert_error(await client.get("/templates/aliases/nope"), 404)
    assert (await client.get("/templates/base")).status_code == 200


# -- capacity --------------------------------------------------------------------------------


async def test_200_concurrent_creates_against_a_cap_of_4(tmp_path: Path) -> None:
    config = make_config(tmp_path, max_sandboxes=4, max_concurrent_boots=4)
    node = Node(config, FakeRuntime(boot_delay_s=0.05))
    await node.start()
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=node), base_url="http://aenv",
            headers={"X-API-Key": KEY},
        ) as c:  # fmt: skip
            rs = await asyncio.gather(
                *(c.post("/v2/sandboxes", json={"templateID": "base"}) for _ in range(200))
            )
            codes = sorted(r.status_code for r in rs)
            assert codes.count(201) == 4 and codes.count(429) == 196, codes
            for r in rs:
                if r.status_code == 429:
                    assert int(r.headers["Retry-After"]) >= 1
                    assert_error(r, 429)
            assert len((await c.get("/sandboxes")).json()) == 4
            # Still 429 (full) after the boots are done, then fine after a kill.
            assert (await c.post("/v2/sandboxes", json={"templateID": "base"})).status_code == 429
            sid = next(r.json()["sandboxID"] for r in rs if r.status_code == 201)
            assert (await c.delete(f"/sandboxes/{sid}")).status_code == 204
            assert (await c.post("/v2/sandboxes", json={"templateID": "base"})).status_code == 201
    finally:
        await node.close()


async def test_create_during_shutdown_is_503(node: Node, client: httpx.AsyncClient) -> None:
    node.begin_shutdown()
    assert_error(await client.post("/v2/sandboxes", json={"templateID": "base"}), 503)
