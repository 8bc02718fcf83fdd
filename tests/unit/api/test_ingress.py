"""How a sandbox's own ports are reached (E2B's allowPublicTraffic, maskRequestHost and
httpsPorts), through a real uvicorn to real upstream servers, one of them HTTPS with a
certificate no client would trust: the traffic access token, the Host the sandbox sees, TLS
to the sandbox, and that the agent's port keeps its own token."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from aenv.api.app import Node
from aenv.orchestrator.fake import FakeRuntime
from tests.support.tls import make_certs

from .conftest import KEY, make_config, serve
from .test_control_plane import assert_error


async def _echo(scope: dict, receive: Any, send: Any) -> None:
    """Answers with what it saw: scheme, Host and the other headers."""
    if scope["type"] != "http":
        return
    body = json.dumps({"scheme": scope["scheme"], "headers": {
        k.decode(): v.decode() for k, v in scope["headers"]}}).encode()  # fmt: skip
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
async def ports(tmp_path: Path) -> AsyncIterator[tuple[int, int, int]]:
    """The agent's stand-in, a plain HTTP port and an HTTPS one (self-made CA)."""
    certs = make_certs(tmp_path / "certs", "sandbox.test")
    async with serve(_echo) as agent, serve(_echo) as plain, serve(
            _echo, ssl_certfile=str(certs.cert), ssl_keyfile=str(certs.key)) as https:
        yield agent, plain, https


@pytest.fixture
async def base(tmp_path: Path, ports: tuple[int, int, int]) -> AsyncIterator[str]:
    node = Node(make_config(tmp_path), FakeRuntime())
    node.proxy.agent_port = ports[0]
    await node.start()
    try:
        async with serve(node) as port:
            yield f"http://127.0.0.1:{port}"
    finally:
        await node.close()


async def _create(c: httpx.AsyncClient, **network: object) -> dict:
    r = await c.post("/v2/sandboxes", json={"templateID": "base", "network": network},
                     headers={"X-API-Key": KEY})  # fmt: skip
    assert r.status_code == 201, r.text
    return r.json()


def _to(sb: dict, port: int, **headers: str) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": str(port), **headers}


async def test_ports_that_are_not_public_need_the_traffic_token(
    base: str, ports: tuple[int, int, int]
) -> None:
    agent, plain, _ = ports
    async with httpx.AsyncClient(base_url=base) as c:
        public = await _create(c)
        assert public["trafficAccessToken"] is None
        assert (await c.get("/", headers=_to(public, plain))).status_code == 200

        sb = await _create(c, allowPublicTraffic=False)
        token = sb["trafficAccessToken"]
        assert token and token != sb["envdAccessToken"]
        assert_error(await c.get("/", headers=_to(sb, plain)), 403, "traffic access token")
        assert_error(await c.get("/", headers=_to(sb, plain, **{
            "e2b-traffic-access-token": sb["envdAccessToken"]})), 403)  # fmt: skip
        r = await c.get("/", headers=_to(sb, plain, **{"e2b-traffic-access-token": token}))
        assert r.status_code == 200
        assert "e2b-traffic-access-token" not in r.json()["headers"]  # never reaches the guest
        # The agent's port keeps its own token, and needs no traffic token.
        r = await c.get("/x", headers=_to(sb, agent, **{"X-Access-Token": sb["envdAccessToken"]}))
        assert r.status_code == 200
        detail = (await c.get(f"/sandboxes/{sb['sandboxID']}", headers={"X-API-Key": KEY})).json()
        assert detail["network"]["allowPublicTraffic"] is False

        # A fork's child: not public either, with a token of its own.
        r = await c.post(f"/sandboxes/{sb['sandboxID']}/fork", json={"count": 1},
                         headers={"X-API-Key": KEY})  # fmt: skip
        kid = r.json()[0]["sandbox"]
        assert kid["trafficAccessToken"] not in (None, token)
        assert_error(await c.get("/", headers=_to(kid, plain, **{
            "e2b-traffic-access-token": token})), 403)  # fmt: skip
        r = await c.get("/", headers=_to(kid, plain, **{
            "e2b-traffic-access-token": kid["trafficAccessToken"]}))  # fmt: skip
        assert r.status_code == 200


async def test_the_host_a_sandbox_sees_and_https_ports(
    base: str, ports: tuple[int, int, int]
) -> None:
    _, plain, https = ports
    async with httpx.AsyncClient(base_url=base) as c:
        sb = await _create(c, maskRequestHost="custom-host.example.com:${PORT}",
                           httpsPorts=[https])  # fmt: skip
        seen = (await c.get("/", headers=_to(sb, plain))).json()
        assert seen["scheme"] == "http"
        assert seen["headers"]["host"] == f"custom-host.example.com:{plain}"
        seen = (await c.get("/", headers=_to(sb, https))).json()
        assert seen["scheme"] == "https"  # TLS to the sandbox, its certificate unchecked
        plain_sb = await _create(c)
        r = await c.get("/", headers=_to(plain_sb, https))
        assert r.status_code == 502  # plain HTTP to an HTTPS port: no answer it can read
        assert (await c.get("/", headers=_to(plain_sb, plain))).json()["headers"]["host"] == (
            f"127.0.0.1:{plain}")

        for network, text in [({"maskRequestHost": "a b"}, "maskRequestHost"),
                              ({"httpsPorts": [0]}, "httpsPorts"),
                              ({"httpsPorts": [True]}, "httpsPorts"),
                              ({"httpsPorts": list(range(1, 102))}, "more than 100")]:
            r = await c.post("/v2/sandboxes", json={"templateID": "base", "network": network},
                             headers={"X-API-Key": KEY})  # fmt: skip
            assert_error(r, 400, text)
