"""The data-plane proxy against a hostile guest server: malformed, huge or ambiguous response
heads and chunk framing are a 502 (or a cut-off body once the head went out), never a node
crash, and the node keeps serving. The guest is a scripted raw-socket server on loopback; the
node (proxy, upstream client) is real, under a real uvicorn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from aenv.api.app import Node
from aenv.api.upstream import MAX_HEAD_BYTES
from aenv.orchestrator.fake import FakeRuntime

from .conftest import KEY, make_config, serve

# Response heads (and bodies) a guest might send; each must be refused.
HEADS: dict[str, bytes] = {
    "head over the cap": b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (2 * MAX_HEAD_BYTES)
                         + b"\r\n\r\n",
    "many headers over the cap": b"HTTP/1.1 200 OK\r\n" + b"x-h: v\r\n" * 20_000 + b"\r\n",
    "bad status line": b"HTTP/1.1 two hundred\r\n\r\n",
    "not HTTP": b"\x00\x01\x02garbage\r\n\r\n",
    "header without colon": b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    "negative content-length": b"HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\nhello",
    "signed content-length": b"HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\nhello",
    "underscored content-length": b"HTTP/1.1 200 OK\r\ncontent-length: 1_0\r\n\r\nhelloworld",
    "differing content-lengths": b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n"
                                 b"content-length: 50\r\n\r\nhello",
    "huge content-length": b"HTTP/1.1 200 OK\r\ncontent-length: " + b"9" * 40 + b"\r\n\r\nx",
}
CHUNKS: dict[str, bytes] = {
    "non-hex chunk size": b"zz\r\nhello\r\n0\r\n\r\n",
    "negative chunk size": b"-5\r\nhello\r\n0\r\n\r\n",
    "0x chunk size": b"0x5\r\nhello\r\n0\r\n\r\n",
    "huge chunk size line": b"5;" + b"e" * (MAX_HEAD_BYTES * 2) + b"\r\nhello\r\n0\r\n\r\n",
    "chunk size over 16 digits": b"1" * 17 + b"\r\nhello\r\n0\r\n\r\n",
}


class Guest:
    """Answers every request on a connection with `reply`, then closes it."""

    def __init__(self) -> None:
        self.reply = b""

    async def __call__(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await r.readuntil(b"\r\n\r\n")
            w.write(self.reply)
            await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[str, Guest, int, dict[str, str]]]:
    guest = Guest()
    srv = await asyncio.start_server(guest, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    node = Node(make_config(tmp_path), FakeRuntime())
    await node.start()
    try:
        async with serve(node) as node_port:
            base = f"http://127.0.0.1:{node_port}"
            async with httpx.AsyncClient(base_url=base, headers={"X-API-Key": KEY}) as c:
                r = await c.post("/v2/sandboxes", json={"templateID": "base"})
                assert r.status_code == 201, r.text
                sid = r.json()["sandboxID"]
            yield base, guest, port, {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(port)}
    finally:
        await node.close()
        srv.close()
        await srv.wait_closed()


async def _still_serving(c: httpx.AsyncClient, guest: Guest, dp: dict[str, str]) -> None:
    guest.reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
    r = await c.get("/after", headers=dp)
    assert (r.status_code, r.text) == (200, "ok")
    assert (await c.get("/health")).status_code == 200


@pytest.mark.parametrize("case", sorted(HEADS))
async def test_bad_response_head_is_a_502(
    case: str, setup: tuple[str, Guest, int, dict[str, str]]
) -> None:
    base, guest, _, dp = setup
    guest.reply = HEADS[case]
    async with httpx.AsyncClient(base_url=base, timeout=10) as c:
        r = await c.get("/x", headers=dp)
        assert r.status_code == 502, (case, r.status_code, r.text[:200])
        assert r.json()["code"] == 502
        await _still_serving(c, guest, dp)


@pytest.mark.parametrize("case", sorted(CHUNKS))
async def test_bad_chunk_framing_cuts_the_body_off(
    case: str, setup: tuple[str, Guest, int, dict[str, str]]
) -> None:
    base, guest, _, dp = setup
    guest.reply = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + CHUNKS[case]
    async with httpx.AsyncClient(base_url=base, timeout=10) as c:
        # The head went out before the framing broke: the client sees a truncated body, never
        # the bytes after the bad size line passed off as content.
        with pytest.raises(httpx.HTTPError):
            r = await c.get("/x", headers=dp)
            assert r.status_code == 502 or r.content != b"hello", (case, r.content[:50])
            raise httpx.RemoteProtocolError("502")  # a clean 502 counts as refused too
        await _still_serving(c, guest, dp)
