"""The host side of the guest flush: what it sends, and which agent answers count as
flushed (the real agent is exercised end to end in tests/e2e/test_fs_pause.py)."""

from __future__ import annotations

import asyncio
import json
import struct

import httpx
import pytest

from aenv.machines import guest_flush
from aenv.machines.api import GuestUnresponsive


def _env(msg: dict, flags: int = 0) -> bytes:
    data = json.dumps(msg).encode()
    return struct.pack(">BI", flags, len(data)) + data


START = _env({"event": {"start": {"pid": 7}}})
DONE = _env({}, flags=2)


def _client(body: bytes, status: int = 200, seen: list | None = None) -> httpx.AsyncClient:
    def handler(req: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(req)
        return httpx.Response(status, content=body)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def test_a_clean_exit_is_a_flush_and_the_request_is_a_connect_stream() -> None:
    seen: list[httpx.Request] = []
    body = START + _env({"event": {"end": {"exited": True, "status": "exit status 0"}}}) + DONE
    async with _client(body, seen=seen) as http:
        await guest_flush.sync_filesystems(http, "http://g", "tok", 5.0)
    req = seen[0]
    assert req.url.path == "/process.Process/Start"
    assert req.headers["X-Access-Token"] == "tok"
    assert req.headers["Content-Type"] == "application/connect+json"
    flags, n = struct.unpack(">BI", req.content[:5])
    assert flags == 0 and json.loads(req.content[5:5 + n]) == {
        "process": {"cmd": "/.aenv/bin/busybox", "args": ["sync"]}}


@pytest.mark.parametrize("body", [
    START + _env({"event": {"end": {"exitCode": 1, "exited": True}}}) + DONE,
    START + _env({"event": {"end": {"exited": False, "status": "signal: killed"}}}) + DONE,
    START + DONE,  # no end event
    _env({"error": {"code": "unavailable", "message": "x"}}, flags=2),
    b"\x00\x00\x00\x00\x09{not json",
])
async def test_anything_but_a_clean_exit_is_unresponsive(body: bytes) -> None:
    async with _client(body) as http:
        with pytest.raises(GuestUnresponsive):
            await guest_flush.sync_filesystems(http, "http://g", None, 5.0)


async def test_an_error_status_or_a_silent_agent_is_unresponsive() -> None:
    async with _client(b"{}", status=401) as http:
        with pytest.raises(GuestUnresponsive, match="401"):
            await guest_flush.sync_filesystems(http, "http://g", None, 5.0)

    async def hang(req: httpx.Request) -> httpx.Response:
        await asyncio.sleep(10)
        return httpx.Response(200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(hang)) as http:
        with pytest.raises(GuestUnresponsive):
            await guest_flush.sync_filesystems(http, "http://g", None, 0.2)
        with pytest.raises(GuestUnresponsive):
            await guest_flush.check_agent(http, "http://g", 0.2)
