"""The data-plane proxy, through a real uvicorn, to a real upstream HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from aenv.api.app import Node
from aenv.api.proxy import file_signature
from aenv.orchestrator.fake import FakeRuntime
from aenv.orchestrator.routes import WAKE_GRACE_S

from .conftest import KEY, make_config, serve

# For tests of streams and WebSockets: a proxy that forgets to end one would hang the client.
WS_TEST_TIMEOUT_S = 60


def bounded(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Fail the test (instead of hanging the session) past WS_TEST_TIMEOUT_S."""

    @functools.wraps(test)
    async def run(*args: Any, **kwargs: Any) -> None:
        async with asyncio.timeout(WS_TEST_TIMEOUT_S):
            await test(*args, **kwargs)

    return run


class Upstream:
    """A stand-in for the in-guest agent: echoes, streams, and records what it saw."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.disconnects = 0
        self.ws_closes: list[int] = []  # close codes of WebSocket clients (the proxy)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await self.websocket(scope, receive, send)
            return
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
        elif path == "/duplex":
            # Answers at once, then echoes each request chunk as it arrives.
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/octet-stream")]})
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                await send({"type": "http.response.body", "body": msg.get("body", b""),
                            "more_body": msg.get("more_body", False)})
                if not msg.get("more_body"):
                    return
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


    async def websocket(self, scope: dict, receive: Any, send: Any) -> None:
        """/ws/echo echoes (a text "close:<code>:<reason>" closes), /ws/stream sends a message
        every 20 ms, /ws/refuse and /ws/redirect answer the handshake with HTTP, /ws/crash
        drops the connection without a close frame."""
        path = scope["path"]
        self.seen.append({
            "path": path, "raw_path": scope["raw_path"].decode(),
            "query": scope["query_string"].decode(), "subprotocols": scope["subprotocols"],
            "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
        })  # fmt: skip
        assert (await receive())["type"] == "websocket.connect"
        if path in ("/ws/refuse", "/ws/redirect"):
            status, extra = (403, []) if path == "/ws/refuse" else (302, [(b"location", b"/x")])
            await send({"type": "websocket.http.response.start", "status": status,
                        "headers": [(b"content-type", b"text/plain"), *extra]})
            await send({"type": "websocket.http.response.body", "body": b"no"})
            return
        offered = scope["subprotocols"]
        await send({"type": "websocket.accept", "subprotocol": offered[-1] if offered else None,
                    "headers": [(b"x-upstream", b"yes")]})  # fmt: skip
        if path == "/ws/crash":
            raise RuntimeError("upstream crashed on purpose")
        if path == "/ws/stream":
            async def tick() -> None:
                for i in range(10_000):
                    await send({"type": "websocket.send", "text": f"tick{i}"})
                    await asyncio.sleep(0.02)

            ticker = asyncio.create_task(tick())
            try:
                msg = await receive()
                while msg["type"] != "websocket.disconnect":
                    msg = await receive()
                self.ws_closes.append(msg.get("code", 1000))
            finally:
                ticker.cancel()
            return
        while True:
            msg = await receive()
            if msg["type"] == "websocket.disconnect":
                self.ws_closes.append(msg.get("code", 1000))
                return
            text = msg.get("text")
            if text is not None and text.startswith("close:"):
                _, code, reason = text.split(":", 2)
                await send({"type": "websocket.close", "code": int(code), "reason": reason})
                return
            if text is not None:
                await send({"type": "websocket.send", "text": text})
            else:
                await send({"type": "websocket.send", "bytes": msg["bytes"]})


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
        r = await c.get("/files", params=old, headers=h)
        assert (r.status_code, r.json()) == (401, {"code": 401,
                                                   "message": "signature is already expired"})
        r = await c.get("/files", params=old)  # the URL alone (no sandbox header), as signed
        assert (r.status_code, r.json()["message"]) == (401, "signature is already expired")
        r = await c.get("/files", params={**old, "signature": "v1_nope"})
        assert r.status_code == 401 and "expired" not in r.text  # the signature comes first
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


@bounded
async def test_full_duplex_response_streams_while_the_request_body_goes_up(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    """A raw HTTP/1.1 client: each request chunk must come back before the next is sent."""
    _, base = origin
    _, port = upstream
    sb = await new_sandbox(base)
    host, origin_port = base.removeprefix("http://").split(":")
    r, w = await asyncio.open_connection(host, int(origin_port))
    try:
        async with asyncio.timeout(10):
            w.write(b"POST /duplex HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                    b"E2b-Sandbox-Id: %s\r\nE2b-Sandbox-Port: %d\r\nX-Access-Token: %s\r\n\r\n"
                    % (sb["sandboxID"].encode(), port, sb["envdAccessToken"].encode()))
            got = b""

            async def until(data: bytes) -> None:
                nonlocal got
                while data not in got:
                    chunk = await r.read(100)
                    assert chunk, got
                    got += chunk

            await until(b"\r\n\r\n")
            assert got.startswith(b"HTTP/1.1 200") and b"chunked" in got.lower()
            for word in (b"first", b"second", b"third"):
                w.write(b"%x\r\n%s\r\n" % (len(word), word))
                await w.drain()
                await until(word)  # echoed while the request body is still open
            w.write(b"0\r\n\r\n")
            await w.drain()
            await until(b"\r\n0\r\n\r\n")
    finally:
        w.close()


def ws(base: str, path: str, headers: dict[str, str] | None = None, **kw: Any) -> connect:
    """A WebSocket client connection to the node's origin (no proxy from the environment)."""
    return connect(base.replace("http://", "ws://") + path, additional_headers=headers,
                   proxy=None, open_timeout=10, **kw)  # fmt: skip


@bounded
async def test_websocket_echoes_text_and_binary_with_its_handshake_forwarded(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    _, base = origin
    app, port = upstream
    sb = await new_sandbox(base)
    headers = {**dp(sb, port), "X-Custom": "1", "Cookie": "a=b"}
    async with ws(base, "/ws/echo?x=1", headers, subprotocols=["chat.v1", "chat.v2"]) as c:
        assert c.subprotocol == "chat.v2"  # the upstream's choice
        assert c.response.headers["x-upstream"] == "yes"
        await c.send("héllo")
        assert await c.recv() == "héllo"
        await c.send(b"\x00\x01binary")
        got = await c.recv()
        assert isinstance(got, bytes) and got == b"\x00\x01binary"
        sent_key = c.request.headers["Sec-WebSocket-Key"]
    seen = app.seen[-1]
    assert seen["raw_path"] == "/ws/echo" and seen["query"] == "x=1"
    assert seen["subprotocols"] == ["chat.v1", "chat.v2"]
    hdrs = seen["headers"]
    assert hdrs["x-custom"] == "1" and hdrs["cookie"] == "a=b"
    assert hdrs["x-access-token"] == sb["envdAccessToken"]
    assert "e2b-sandbox-id" not in hdrs and hdrs["host"] == f"127.0.0.1:{port}"
    assert hdrs["sec-websocket-key"] != sent_key  # each hop has its own handshake
    # prefix and host routing
    tok = {"X-Access-Token": sb["envdAccessToken"]}
    async with ws(base, f"/proxy/{sb['sandboxID']}/{port}/ws/echo", tok) as c:
        await c.send("via prefix")
        assert await c.recv() == "via prefix"
    assert app.seen[-1]["path"] == "/ws/echo"
    # the URI (and so the Host header) names the sandbox; the TCP connection goes to the node
    origin_port = int(base.rsplit(":", 1)[1])
    async with connect(f"ws://{port}-{sb['sandboxID']}.sbx.test:{origin_port}/ws/echo",
                       host="127.0.0.1", port=origin_port, additional_headers=tok,
                       proxy=None) as c:  # fmt: skip
        await c.send("via host")
        assert await c.recv() == "via host"


@bounded
async def test_websocket_large_messages_pass_both_ways(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    _, base = origin
    _, port = upstream
    sb = await new_sandbox(base)
    big = bytes(range(256)) * (8 << 12)  # 8 MiB
    async with ws(base, "/ws/echo", dp(sb, port), max_size=None) as c:
        await c.send(big)
        assert await c.recv() == big
        text = "é" * (1 << 20)
        await c.send(text)
        assert await c.recv() == text
        # beyond the limit (16 MiB) the proxy refuses the message: 1009
        await c.send(b"x" * (17 << 20))
        with pytest.raises(ConnectionClosed) as e:
            await c.recv()
        assert e.value.rcvd is not None and e.value.rcvd.code == 1009


@bounded
async def test_websocket_close_codes_pass_both_ways(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    node, base = origin
    app, port = upstream
    sb = await new_sandbox(base)
    streams = node.orchestrator.routes.get(sb["sandboxID"]).streams
    # the sandbox closes: its code and reason reach the client
    async with ws(base, "/ws/echo", dp(sb, port)) as c:
        await c.send("close:4001:bye now")
        with pytest.raises(ConnectionClosed) as e:
            await c.recv()
        assert e.value.rcvd is not None
        assert (e.value.rcvd.code, e.value.rcvd.reason) == (4001, "bye now")
    # the client closes mid-stream: its code reaches the sandbox
    async with ws(base, "/ws/stream", dp(sb, port)) as c:
        assert (await c.recv()).startswith("tick")
        assert len(streams) == 1
        await c.close(4002, "done")
    await _until(lambda: app.ws_closes == [4002] and not streams)
    # the sandbox's side drops without a close frame: 1014 (bad gateway)
    async with ws(base, "/ws/crash", dp(sb, port)) as c:
        with pytest.raises(ConnectionClosed) as e:
            await c.recv()
        assert e.value.rcvd is not None and e.value.rcvd.code == 1014
    await _until(lambda: not streams)


@bounded
async def test_websocket_handshake_denials_are_http_responses(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    _, base = origin
    _, port = upstream
    sb = await new_sandbox(base)

    async def refused(path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        with pytest.raises(InvalidStatus) as e:
            async with ws(base, path, headers):
                pass
        return e.value.response.status_code, e.value.response.body

    status, body = await refused("/", {"E2b-Sandbox-Id": "nope"})
    assert status == 502
    assert json.loads(body) == {"code": 502, "message": "The sandbox nope was not found"}
    status, body = await refused("/", dp(sb, port, token=False))  # the agent port's token
    assert status == 401 and b"access token" in body
    status, body = await refused("/", dp(sb, 1))  # nothing listens on port 1
    assert status == 502 and b"port is not open" in body
    # the sandbox's own refusal is relayed; its redirect too, never followed
    assert await refused("/ws/refuse", dp(sb, port)) == (403, b"no")
    assert (await refused("/ws/redirect", dp(sb, port)))[0] == 302


@bounded
async def test_websocket_denial_without_http_response_extension_is_a_close(
    origin: tuple[Node, str],
) -> None:
    node, _ = origin
    sent: list[dict] = []
    msgs = [{"type": "websocket.connect"}]

    async def receive() -> dict:
        return msgs.pop(0)

    async def send(m: dict) -> None:
        sent.append(m)

    scope = {"type": "websocket", "path": "/", "raw_path": b"/", "query_string": b"",
             "headers": [(b"e2b-sandbox-id", b"x")], "subprotocols": []}  # fmt: skip
    await node(scope, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1011,
                     "reason": "The sandbox x was not found"}]  # fmt: skip


@bounded
@pytest.mark.parametrize("how", ["kill", "pause"])
async def test_killing_or_pausing_a_sandbox_closes_its_websockets(
    origin: tuple[Node, str], upstream: tuple[Upstream, int], how: str
) -> None:
    node, base = origin
    app, port = upstream
    sb = await new_sandbox(base)
    sid = sb["sandboxID"]
    async with ws(base, "/ws/stream", dp(sb, port)) as c:
        assert (await c.recv()).startswith("tick")
        async with httpx.AsyncClient(base_url=base, headers={"X-API-Key": KEY}) as api:
            t0 = time.monotonic()
            if how == "kill":
                assert (await api.delete(f"/sandboxes/{sid}")).status_code == 204
            else:
                assert (await api.post(f"/sandboxes/{sid}/pause")).status_code == 204
            with pytest.raises(ConnectionClosed) as e:
                while True:
                    await c.recv()
            assert time.monotonic() - t0 < 5
        assert e.value.rcvd is not None and e.value.rcvd.code == 1001
    await _until(lambda: len(app.ws_closes) == 1)  # the sandbox's side was closed too
    if how == "pause":
        async with httpx.AsyncClient(base_url=base, headers={"X-API-Key": KEY}) as api:
            await api.delete(f"/sandboxes/{sid}")


async def _until(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@bounded
async def test_a_resumed_sandboxs_port_gets_a_grace_period_to_open(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    """A server the timeout paused while it was starting: the request that wakes the
    sandbox waits for its port (for WAKE_GRACE_S) instead of a 502; a sandbox that was not
    resumed gets the 502 at once."""
    _, base = origin
    app, _ = upstream
    sb = await new_sandbox(base, autoPause=True, autoResume={"enabled": True})
    fresh = await new_sandbox(base)
    port = _free_port()
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        t0 = time.monotonic()
        r = await c.get("/", headers=dp(fresh, port))
        assert r.status_code == 502 and "port is not open" in r.json()["message"]
        assert time.monotonic() - t0 < 2  # no grace without a resume
        r = await c.post(f"/sandboxes/{sb['sandboxID']}/pause", headers={"X-API-Key": KEY})
        assert r.status_code == 204

        async def late_server() -> None:
            await asyncio.sleep(1.5)
            async with serve(app, port):
                await asyncio.sleep(10)

        server = asyncio.create_task(late_server())
        try:
            t0 = time.monotonic()
            r = await c.get("/late", headers=dp(sb, port))  # resumes it, then waits
            assert r.status_code == 200, r.text
            assert r.json()["path"] == "/late" and time.monotonic() - t0 >= 1.4
        finally:
            server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await server
        # past the grace period a closed port is a 502 again, at once
        node, _ = origin
        route = node.orchestrator.routes.get(sb["sandboxID"])
        assert route is not None and route.woke_at is not None
        route.woke_at -= WAKE_GRACE_S
        t0 = time.monotonic()
        r = await c.get("/", headers=dp(sb, port))
        assert r.status_code == 502 and time.monotonic() - t0 < 2


async def test_requests_wait_for_a_start_behind_the_call_and_see_how_it_ended(
    origin: tuple[Node, str], upstream: tuple[Upstream, int]
) -> None:
    """A fork child's /init runs behind the fork: its requests wait for it, then pass; if it
    failed, or the child was killed meanwhile (the start cancelled), they get a 502."""
    node, base = origin
    _, port = upstream
    async with httpx.AsyncClient(base_url=base) as c:
        for end in ("done", "failed", "cancelled"):
            sb = await new_sandbox(base)
            route = node.orchestrator.routes.get(sb["sandboxID"])
            assert route is not None
            start: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            route.handle.ready = start
            req = asyncio.create_task(c.get("/health", headers=dp(sb, port)))
            await asyncio.sleep(0.2)
            assert not req.done()  # held while the start runs
            if end == "done":
                start.set_result(None)
            elif end == "failed":
                start.set_exception(RuntimeError("agent /init failed"))
            else:
                start.cancel()
            r = await req
            if end == "done":
                assert r.status_code == 204
            else:
                assert r.status_code == 502, r.text
                assert r.json()["message"] == f"sandbox {sb['sandboxID']} failed to start"
