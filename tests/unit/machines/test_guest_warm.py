"""Warming a primed VM (machines/guest_warm.py): what it asks the agent to run, and that a
guest it cannot warm is still primed (warm answers False, never raises). The real agent and
the primed pool: tests/e2e/test_primed.py."""

from __future__ import annotations

import json
import struct

import httpx

from aenv.machines import guest_warm


def _env(msg: dict, flags: int = 0) -> bytes:
    data = json.dumps(msg).encode()
    return struct.pack(">BI", flags, len(data)) + data


def _agent(ends: list[bytes], seen: list[dict]) -> httpx.AsyncClient:
    def handler(req: httpx.Request) -> httpx.Response:
        seen_tokens.append(req.headers.get("x-access-token"))
        n = struct.unpack(">BI", req.content[:5])[1]
        seen.append(json.loads(req.content[5:5 + n]))
        return httpx.Response(200, content=ends[len(seen) - 1])

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


seen_tokens: list[str | None] = []
CLEAN = _env({"event": {"end": {"exited": True}}}) + _env({}, flags=2)


async def test_a_shell_on_a_terminal_then_on_pipes_reading_no_startup_file() -> None:
    seen: list[dict] = []
    async with _agent([CLEAN, CLEAN], seen) as http:
        assert await guest_warm.warm(http, "http://g", "tok") is True
    assert [("pty" in m) for m in seen] == [True, False]
    assert seen_tokens[-2:] == ["tok", "tok"]  # the token priming's /init gave the agent
    for m in seen:
        p = m["process"]
        assert p["cmd"] == "/bin/bash" and p["args"][:2] == ["--noprofile", "--norc"]
        assert p["envs"] == {"HISTFILE": ""}  # no history written


async def test_a_guest_without_bash_is_not_warmed_and_nothing_raises() -> None:
    missing = _env({"error": {"code": "not_found", "message": "no /bin/bash"}}, flags=2)
    seen: list[dict] = []
    async with _agent([missing], seen) as http:
        assert await guest_warm.warm(http, "http://g", None) is False
    assert len(seen) == 1  # it stops at the first failure
    failed = _env({"event": {"end": {"exited": True, "exitCode": 127}}}) + _env({}, flags=2)
    seen = []
    async with _agent([failed], seen) as http:
        assert await guest_warm.warm(http, "http://g", None) is False
