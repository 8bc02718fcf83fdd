"""The data-plane proxy, through a real uvicorn, to a real upstream HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from aenv.api.app import Node
from aenv.api.proxy import file_signature
from aenv.orchestrator.fake import FakeRuntime

from .conftest import KEY, make_config, serve


class Upstream:
    """A stand-in for the in-guest agent: echoes, streams, and records what it saw."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.disconnects = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        self.seen.append({
            "method": scope["method"], "path": path, "raw_path": scope["raw_path"].decode(),
            "query": scope["query_string"].decode(),
            "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
        })  # fmt: skip
        if path == "/health":
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
        elif path == "/echo":
            # HTTP/1.1 clients (httpx too) send the whole body before reading the response:
            # count it as it streams in, then stream the same number of bytes back.
            size = 0
            while True:
                msg = await receive()
                size += len(msg.get("body", b""))
                if not msg.get("more_body"):
                    break
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/octet-stream")]})
            for off in range(0, size, 65536):
                await send({"type": "http.response.body", "more_body": True,
                            "body": b"y" * min(65536, size - off)})
            await send({"type": "http.response.body", "body": b""})
        elif path == "/stream":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/connect+json")]})
            gone = asyncio.Event()

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                gone.set()

            watcher = asyncio.create_task(watch())
            for i in range(10_000):
                await send({"type": "http.response.body", "body": f"chunk{i}\n".encode(),
                            "more_body": True})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(gone.wait(), 0.05)
                if gone.is_set():
                    self.disconnects += 1
                    break
            watcher.cancel()
        else:
            data = json.dumps(self.seen[-1]).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"x-upstream", b"yes"), (b"connection", b"keep-alive")]})
            await send({"type": "http.response.body", "body": data})


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Upstream, int]]:
    app = Upstream()
    async with serve(app) as port:
        yield app, port


@pytest.fixture
async def origin(tmp_path: Path, upstream: tuple[Upstream, int]) -> AsyncIterator[tuple[Node, str]]:
    node = Node(make_config(tmp_path, domain="sbx.test"), FakeRuntime())
    node.proxy.agent_port = upstream[1]  # the upstream plays the agent: tokens are enforced
    await node.start()
    try:
        async with serve(node) as port:
            yield node, f"http://127.0.0.1:{port}"
    finally:
        await node.close()


async def new_sandbox(base: str, **body: object) -> dict:
    async with httpx.AsyncClient(base_url=base, headers={"X-API-Key": KEY}) as c:
        r = await c.post("/v2/sandboxes", json={"templateID": "base", **body})
        assert r.status_code == 201, r.text
        return r.json()


def dp(sb: dict, port: int, token: bool = True) -> dict[str, str]:
    h = {"E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": str(port)}
    if token:
        h["X-Access-Token"] = sb["envdAccessToken"]
    return h


async def test_header_routing_strips_routing_and_hop_headers(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    _, base = origin
    app, port = upstream
    sb = await new_sandbox(base)
    async with httpx.AsyncClient(base_url=base) as c:
        r = await c.get("/some/path%2Fx?a=1&b=%20", headers={**dp(sb, port), "X-Custom": "1",
                                                                "Connection": "keep-alive"})
        assert r.status_code == 200, r.text
        seen = r.json()
        assert r.headers["x-upstream"] == "yes"
        assert seen["raw_path"] == "/some/path%2Fx" and seen["query"] == "a=1&b=%20"
        hdrs = seen["headers"]
        assert hdrs["x-custom"] == "1" and hdrs["x-access-token"] == sb["envdAccessToken"]
        assert "e2b-sandbox-id" not in hdrs and "e2b-sandbox-port" not in hdrs
        assert hdrs["host"] == f"127.0.0.1:{port}"
        # the x-agentenv spelling
        r = await c.get("/x", headers={"x-agentenv-sandbox-id": sb["sandboxID"],
                                       "x-agentenv-target-port": str(port),
                                       "X-Access-Token": sb["envdAccessToken"]})
        assert r.status_code == 200 and "x-agentenv-sandbox-id" not in r.json()["headers"]


async def test_prefix_and_host_routing(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    _, base = origin
    _, port = upstream
    sb = await new_sandbox(base)
    tok = {"X-Access-Token": sb["envdAccessToken"]}
    async with httpx.AsyncClient(base_url=base) as c:
        r = await c.get(f"/proxy/{sb['sandboxID']}/{port}/deep/p?q=1", headers=tok)
        assert r.status_code == 200 and r.json()["path"] == "/deep/p" and r.json()["query"] == "q=1"
        r = await c.get(f"/proxy/{sb['sandboxID']}/{port}", headers=tok)
        assert r.status_code == 200 and r.json()["path"] == "/"
        r = await c.get("/hosted", headers={**tok, "Host": f"{port}-{sb['sandboxID']}.sbx.test"})
        assert r.status_code == 200 and r.json()["path"] == "/hosted"
        # a host under the domain that is not <port>-<id> is control plane
        r = await c.get("/health", headers={"Host": "api.sbx.test"})
        assert r.status_code == 200 and r.json()["status"] == "ok"


async def test_unknown_and_killed_sandboxes_are_502_not_found(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    _, base = origin
    _, port = upstream
    async with httpx.AsyncClient(base_url=base) as c:
        r = await c.get("/health", headers={"E2b-Sandbox-Id": "nope"})
        assert r.status_code == 502
        assert r.json() == {"code": 502, "message": "The sandbox nope was not found"}
        r = await c.get("/proxy/nope/49983/health")
        assert r.status_code == 502 and "was not found" in r.json()["message"]
        sb = await new_sandbox(base)
        assert (await c.get("/health", headers=dp(sb, port))).status_code == 204
        await c.delete(f"/sandboxes/{sb['sandboxID']}", headers={"X-API-Key": KEY})
        r = await c.get("/health", headers=dp(sb, port))
        assert r.status_code == 502 and "was not found" in r.json()["message"]


async def test_closed_port_is_502_port_not_open(origin: tuple[Node, str]) -> None:
    _, base = origin
    sb = await new_sandbox(base)
    async with httpx.AsyncClient(base_url=base) as c:
        r = await c.get("/", headers=dp(sb, 1))  # nothing listens on port 1
        assert r.status_code == 502 and "port is not open" in r.json()["message"]
        r = await c.get("/", headers={"E2b-Sandbox-Id": sb["sandboxID"],
                                      "E2b-Sandbox-Port": "99999"})
        assert r.status_code == 400


async def test_access_token_is_enforced_on_the_agent_port(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    _, base = origin
    _, port = upstream
    sb = await new_sandbox(base)
    async with httpx.AsyncClient(base_url=base) as c:
        r = await c.get("/envs", headers=dp(sb, port, token=False))
        assert r.status_code == 401 and "access token" in r.json()["message"]
        r = await c.get("/envs", headers={**dp(sb, port, token=False), "X-Access-Token": "no"})
        assert r.status_code == 401
        r = await c.post("/init", headers=dp(sb, port, token=False), json={"accessToken": "x"})
        assert r.status_code == 401
        assert (await c.get("/health", headers=dp(sb, port, token=False))).status_code == 204
        assert (await c.get("/envs", headers=dp(sb, port))).status_code == 200
        # files: a valid signature instead of the header
        path, user = "/home/user/a.txt", "user"
        sig = file_signature(path, "read", user, sb["envdAccessToken"], None)
        ok = {"path": path, "username": user, "signature": sig}
        h = dp(sb, port, token=False)
        assert (await c.get("/files", params=ok, headers=h)).status_code == 200
        assert (await c.post("/files", params=ok, headers=h)).status_code == 401  # op=write
        bad = {**ok, "signature": "v1_nope"}
        assert (await c.get("/files", params=bad, headers=h)).status_code == 401
        exp = int(time.time()) - 5
        old = {**ok, "signature_expiration": str(exp),
               "signature": file_signature(path, "read", user, sb["envdAccessToken"], str(exp))}
        assert (await c.get("/files", params=old, headers=h)).status_code == 401
    # v1 insecure sandboxes have no token to check
    async with httpx.AsyncClient(base_url=base, headers={"X-API-Key": KEY}) as c:
        open_sb = (await c.post("/sandboxes", json={"templateID": "base", "secure": False})).json()
        r = await c.get("/envs", headers={"E2b-Sandbox-Id": open_sb["sandboxID"],
                                          "E2b-Sandbox-Port": str(port)})
        assert r.status_code == 200


async def test_signed_files_url_without_header_finds_its_sandbox(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    _, base = origin
    app, _ = upstream
    await new_sandbox(base)  # a decoy
    sb = await new_sandbox(base)
    exp = str(int(time.time()) + 60)
    sig = file_signature("/f", "write", "", sb["envdAccessToken"], exp)
    async with httpx.AsyncClient(base_url=base) as c:
        r = await c.post("/files", params={"path": "/f", "signature": sig,
                                           "signature_expiration": exp}, content=b"data")
        assert r.status_code == 200, r.text
        assert r.json()["path"] == "/files"
        r = await c.get("/files", params={"path": "/f", "signature": "v1_forged"})
        assert r.status_code == 401


async def test_bodies_stream_both_ways(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    _, base = origin
    _, port = upstream
    sb = await new_sandbox(base)
    size = 8 << 20

    async def body() -> AsyncIterator[bytes]:
        for _ in range(size // 65536):
            yield b"x" * 65536

    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        r = await c.post("/echo", headers=dp(sb, port), content=body())
        assert r.status_code == 200 and len(r.content) == size
        # a response streams: the first chunk arrives long before the stream ends
        t0 = time.monotonic()
        async with c.stream("GET", "/stream", headers=dp(sb, port)) as resp:
            assert resp.headers["content-type"] == "application/connect+json"
            first = await anext(resp.aiter_raw())
            assert first.startswith(b"chunk0") and time.monotonic() - t0 < 2


async def test_killing_a_sandbox_drops_its_open_streams(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    node, base = origin
    app, port = upstream
    sb = await new_sandbox(base)
    async with (
        httpx.AsyncClient(base_url=base, timeout=10) as c,
        c.stream("GET", "/stream", headers=dp(sb, port)) as resp,
    ):
        it = resp.aiter_raw()
        await anext(it)
        assert len(node.orchestrator.routes.get(sb["sandboxID"]).streams) == 1
        killer = asyncio.create_task(
            c.delete(f"/sandboxes/{sb['sandboxID']}", headers={"X-API-Key": KEY})
        )
        t0 = time.monotonic()
        with pytest.raises(httpx.RemoteProtocolError):
            async for _ in it:
                pass
        assert time.monotonic() - t0 < 2
        assert (await killer).status_code == 204
    for _ in range(100):
        if app.disconnects:
            break
        await asyncio.sleep(0.02)
    assert app.disconnects == 1  # the upstream side was closed too


async def test_client_going_away_releases_the_upstream(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    node, base = origin
    app, port = upstream
    sb = await new_sandbox(base)
    async with (
        httpx.AsyncClient(base_url=base, timeout=10) as c,
        c.stream("GET", "/stream", headers=dp(sb, port)) as resp,
    ):
        await anext(resp.aiter_raw())
    for _ in range(100):
        if app.disconnects and not node.orchestrator.routes.get(sb["sandboxID"]).streams:
            break
        await asyncio.sleep(0.02)
    assert app.disconnects == 1
    assert not node.orchestrator.routes.get(sb["sandboxID"]).streams


async def test_websocket_is_refused_for_now(origin: tuple[Node, str]) -> None:
    node, _ = origin
    sent: list[dict] = []
    msgs = [{"type": "websocket.connect"}]

    async def receive() -> dict:
        return msgs.pop(0)

    async def send(m: dict) -> None:
        sent.append(m)

    scope = {"type": "websocket", "path": "/", "raw_path": b"/", "query_string": b"",
             "headers": [(b"e2b-sandbox-id", b"x")]}  # fmt: skip
    await node(scope, receive, send)
    assert sent[0]["type"] == "websocket.close"
