"""The node's parsing of guest replies against a hostile fake agent on loopback.

The fake agent is a raw-socket server (the guest side, scripted); what is under test is the
node's real code: `Runtime.agent_metrics`, `Runtime.push_init`, `Runtime.wait_agent`, the
sample conversion in the orchestrator, and `agent_replies` beneath them. Every hostile reply
must end in a clear `GuestReplyError`/`BootError` (or a valid, in-range sample) within the
call's deadline, after reading a bounded number of bytes.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aenv.config import MachineShape
from aenv.machines import agent_replies
from aenv.machines import runtime as runtime_mod
from aenv.machines.agent_replies import (
    MAX_REPLY_BYTES,
    MAX_REPORTED_BYTES,
    AgentReply,
    GuestReplyError,
)
from aenv.machines.api import AGENT_PORT, AgentInit, SandboxHandle
from aenv.machines.machine import AGENT_METRICS_TIMEOUT, BootError, Machine
from aenv.machines.runtime import Runtime
from aenv.network.slot import Slot
from aenv.orchestrator.observing import _metric_from_agent

from .conftest import make_config

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
SLACK_S = 1.5  # scheduling slack on a busy 2-core host, on top of a call's own deadline
# What a reader that stops at the cap may still have let the kernel buffer (socket buffers).
MAX_SENT_BYTES = 16 << 20
INIT_DEADLINE_S = 3.0  # the /init deadline for these tests (the node's is AGENT_INIT_TIMEOUT)


@dataclass
class FakeAgent:
    """A scripted raw-socket 'agent' on 127.x.y.z:49983 (the runtime dials that fixed port);
    `sent` counts the bytes it managed to write."""

    addr: str
    script: Script | None = None
    sent: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.tasks.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await r.readuntil(b"\r\n\r\n")
            assert self.script is not None
            await self.script(r, w)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            w.transport.abort()

    async def write(self, w: asyncio.StreamWriter, data: bytes) -> None:
        w.write(data)
        await w.drain()
        self.sent += len(data)


@pytest.fixture
async def agent() -> AsyncIterator[FakeAgent]:
    for _ in range(20):
        addr = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(1, 254)}"
        fake = FakeAgent(addr)
        try:
            srv = await asyncio.start_server(fake.handle, addr, AGENT_PORT)
            break
        except OSError:
            continue
    else:
        pytest.fail("no free loopback address for the fake agent")
    try:
        yield fake
    finally:
        srv.close()
        for t in list(fake.tasks):
            t.cancel()
        await asyncio.gather(*fake.tasks, return_exceptions=True)
        await srv.wait_closed()


class _Vm:
    """Only what wait_agent's error path asks of a VM."""

    async def console_tail(self, n: int = 1500) -> str:
        return "(console)"


@pytest.fixture
async def machine(tmp_path: Path, agent: FakeAgent) -> AsyncIterator[tuple[Runtime, Machine]]:
    rt = Runtime(make_config(tmp_path, runtime="qemu"))
    slot = Slot(index=0, netns="x", netns_path=tmp_path, tap="tap0", tap_uid=0,
                host_veth="v", host_addr=agent.addr, slot_addr=agent.addr)  # fmt: skip
    m = Machine("g1", _Vm(), slot, tmp_path, "base", access_token="tok")  # type: ignore[arg-type]
    rt._machines[m.name] = m
    try:
        yield rt, m
    finally:
        await m.http.aclose()


def _handle(agent: FakeAgent) -> SandboxHandle:
    return SandboxHandle("g1", "base", MachineShape(vcpus=1, memory_mib=512, disk_mib=1024),
                         agent.addr, 0)  # fmt: skip


def reply(body: bytes, status: str = "200 OK", headers: bytes = b"") -> Script:
    """One well-framed reply, then the connection closes (the fake serves one request)."""

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 " + status.encode() + b"\r\ncontent-length: %d\r\n" % len(body)
                + b"connection: close\r\n" + headers + b"\r\n" + body)  # fmt: skip
        await w.drain()

    return script


def json_reply(value: Any) -> Script:
    return reply(json.dumps(value).encode(), headers=b"content-type: application/json\r\n")


# --- hostile transports ------------------------------------------------------------------


def endless(framing: str) -> Script:
    """A body that never ends, as fast as the reader takes it."""

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, agent: FakeAgent) -> None:
        block = b"7" * 65536
        head = {"length": b"content-length: %d\r\n" % (1 << 40),
                "chunked": b"transfer-encoding: chunked\r\n", "eof": b""}[framing]
        await agent.write(w, b"HTTP/1.1 200 OK\r\n" + head + b"\r\n")
        while True:
            await agent.write(w, b"10000\r\n" + block + b"\r\n" if framing == "chunked" else block)

    return script  # type: ignore[return-value]


def slowloris(where: str) -> Script:
    """One byte every 0.2 s: in the head, or in a (small) body."""

    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n"
        if where == "body":
            w.write(head)
            head = b"{" * 1000
        for b in head:
            w.write(bytes([b]))
            await w.drain()
            await asyncio.sleep(0.2)

    return script


async def silent(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await asyncio.sleep(60)


async def hang_up(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    return


def huge_headers(kind: str) -> Script:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter, agent: FakeAgent) -> None:
        await agent.write(w, b"HTTP/1.1 200 OK\r\n")
        if kind == "one":
            await agent.write(w, b"x-big: " + b"a" * (8 << 20) + b"\r\n\r\n{}")
        else:
            for i in range(200_000):
                await agent.write(w, b"x-h%d: v\r\n" % i)
        await asyncio.sleep(30)

    return script  # type: ignore[return-value]


def garbage(data: bytes) -> Script:
    async def script(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(data)
        await w.drain()
        await asyncio.sleep(30)

    return script


HOSTILE: dict[str, Script] = {
    "endless content-length body": endless("length"),
    "endless chunked body": endless("chunked"),
    "endless body to EOF": endless("eof"),
    "slowloris head": slowloris("head"),
    "slowloris body": slowloris("body"),
    "accepts, never answers": silent,
    "hangs up": hang_up,
    "one 8 MiB header": huge_headers("one"),
    "200k headers": huge_headers("many"),
    "gzip bomb": reply(gzip.compress(b"\0" * (32 << 20)), headers=b"content-encoding: gzip\r\n"),
    "body over the cap": reply(b"{" + b" " * (MAX_REPLY_BYTES + 10) + b"}"),
    "binary garbage": garbage(bytes(range(256)) * 64),
    "bad status line": garbage(b"HTTP/1.1 two hundred\r\n\r\n"),
    "negative content-length": garbage(b"HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n{}"),
    "bad chunk size": garbage(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"),
}


def _bind(agent: FakeAgent, script: Script) -> None:
    """Scripts that count what they send take the agent as a third argument."""
    if script.__code__.co_argcount == 3:
        agent.script = lambda r, w: script(r, w, agent)  # type: ignore[call-arg]
    else:
        agent.script = script


async def _timed(coro: Awaitable[Any]) -> tuple[float, Any]:
    t0 = time.monotonic()
    try:
        result: Any = await coro
    except (GuestReplyError, BootError) as e:
        result = e
    return time.monotonic() - t0, result


@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_hostile_metrics_reply_is_a_bounded_error(
    case: str, agent: FakeAgent, machine: tuple[Runtime, Machine]
) -> None:
    rt, _ = machine
    _bind(agent, HOSTILE[case])
    took, result = await _timed(rt.agent_metrics(_handle(agent)))
    assert isinstance(result, GuestReplyError), (case, result)
    assert took < AGENT_METRICS_TIMEOUT + SLACK_S, (case, took)
    assert agent.sent < MAX_SENT_BYTES, (case, agent.sent)


@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_hostile_init_reply_fails_the_boot_within_its_deadline(
    case: str, agent: FakeAgent, machine: tuple[Runtime, Machine],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rt, m = machine
    monkeypatch.setattr(runtime_mod, "AGENT_INIT_TIMEOUT", INIT_DEADLINE_S)  # a faster test
    _bind(agent, HOSTILE[case])
    took, result = await _timed(rt.push_init(m, AgentInit(access_token="t")))
    # A reply whose head is fine and says 2xx is an accepted /init, even with a bad body;
    # everything else fails the boot.
    assert isinstance(result, BootError) or result is None, (case, result)
    assert took < INIT_DEADLINE_S + SLACK_S, (case, took)
    assert agent.sent < MAX_SENT_BYTES, (case, agent.sent)
    if case in ("body over the cap", "gzip bomb", "bad status line", "accepts, never answers"):
        assert isinstance(result, BootError), case


async def test_hostile_health_never_counts_as_up(
    agent: FakeAgent, machine: tuple[Runtime, Machine]
) -> None:
    rt, m = machine
    for case in ("slowloris head", "endless chunked body", "bad status line", "hangs up"):
        _bind(agent, HOSTILE[case])
        took, result = await _timed(rt.wait_agent(m, 2.5))
        assert isinstance(result, BootError) and "(console)" in str(result), (case, result)
        assert took < 2.5 + 1.0 + SLACK_S, (case, took)
    _bind(agent, reply(b"", "204 No Content"))
    assert await rt.wait_agent(m, 5.0) is None


async def test_agent_metrics_accepts_a_real_reply(
    agent: FakeAgent, machine: tuple[Runtime, Machine]
) -> None:
    rt, _ = machine
    real = {"ts": 1, "cpu_count": 2, "cpu_used_pct": 12.5, "mem_total": 512 << 20,
            "mem_used": 100 << 20, "disk_used": 1 << 30, "disk_total": 4 << 30}  # fmt: skip
    _bind(agent, json_reply(real))
    sample = _metric_from_agent(await rt.agent_metrics(_handle(agent)), 7)
    assert (sample.ts_us, sample.cpu_count, sample.cpu_used_pct, sample.mem_cache) == (
        7, 2, 12.5, 0)
    assert (sample.mem_used, sample.disk_total) == (100 << 20, 4 << 30)


# --- hostile JSON ------------------------------------------------------------------------

KEYS = ["cpu_count", "cpu_used_pct", "mem_used", "mem_total", "mem_cache", "disk_used",
        "disk_total", "ts"]  # fmt: skip
NUMBERS = st.one_of(
    st.integers(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 2**53, 2**63, 2**64, 10**400, MAX_REPORTED_BYTES + 1, 101, 1e308]),
)
JSON_LEAF = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=20))
JSON = st.recursive(JSON_LEAF, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8),
                                                kids, max_size=8)),  # fmt: skip
    max_leaves=20)
METRICS_SHAPED = st.dictionaries(st.sampled_from(KEYS), JSON_LEAF | NUMBERS, max_size=8)
RAW = st.one_of(
    st.sampled_from([b"", b"{", b"NaN", b'{"cpu_count": NaN}', b'{"mem_used": Infinity}',
                     b'{"mem_used": -Infinity}', b'{"mem_used": 1e999}', b"\xff\xfe{}",
                     b'{"mem_used": ' + b"9" * 5000 + b"}", b"[" * 20000 + b"]" * 20000]),
    st.binary(max_size=64),
)


def _check_sample(raw: dict[str, Any]) -> None:
    """Either a sample whose every field is in range, or a GuestReplyError: nothing else."""
    try:
        s = _metric_from_agent(raw, 1)
    except GuestReplyError:
        return
    assert 1 <= s.cpu_count <= 1024
    assert math.isfinite(s.cpu_used_pct) and 0 <= s.cpu_used_pct <= 100
    for v in (s.mem_used, s.mem_total, s.mem_cache, s.disk_used, s.disk_total):
        assert type(v) is int and 0 <= v <= MAX_REPORTED_BYTES
    for key in KEYS[:-1]:
        v = raw.get(key)
        assert v is None or (not isinstance(v, bool) and isinstance(v, int | float)), raw


def _serialize(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(value=st.one_of(JSON, METRICS_SHAPED))
def test_any_json_is_a_valid_sample_or_a_clear_error(value: Any) -> None:
    try:
        raw = AgentReply(200, _serialize(value)).json_object()
    except GuestReplyError:
        return
    _check_sample(raw)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))  # fmt: skip
@given(body=RAW)
def test_any_bytes_are_an_object_or_a_clear_error(body: bytes) -> None:
    try:
        raw = AgentReply(200, body).json_object()
    except GuestReplyError:
        return
    assert isinstance(raw, dict)
    _check_sample(raw)


async def test_hostile_json_over_http_never_breaks_the_sampler(
    agent: FakeAgent, machine: tuple[Runtime, Machine]
) -> None:
    """The same shapes served by the fake agent over HTTP, through `agent_metrics`."""
    rt, _ = machine
    rng = random.Random(7)
    pool: list[Any] = [0, -1, 1, 2**53, 2**63, 10**400, 1e308, -0.0, 100.5, float("nan"),
                       float("inf"), "1", True, None, [1], {"a": 1}]  # fmt: skip
    examples: list[Any] = [{k: rng.choice(pool) for k in rng.sample(KEYS, rng.randint(0, 8))}
                           for _ in range(40)]  # fmt: skip
    accepted = 0
    examples += [{"cpu_count": 10**400}, {"mem_used": 2**63}, {"cpu_used_pct": -0.1},
                 {"disk_total": "1"}, {"cpu_count": True}, {"mem_total": [1]}, {"mem_used": 1.5}]
    for value in examples:
        agent.script = reply(_serialize(value))
        took, result = await _timed(rt.agent_metrics(_handle(agent)))
        assert took < AGENT_METRICS_TIMEOUT + SLACK_S
        if isinstance(result, GuestReplyError):
            assert "within" not in str(result), result  # refused for its content, not time
        else:
            _check_sample(result)
            accepted += 1
    assert accepted > 0  # in-range examples make it through
    for body in (b'{"mem_used": NaN}', b'{"cpu_count": Infinity}', b"[" * 20000 + b"]" * 20000,
                 b"\xff" * 100, b'{"cpu_count": 1} trailing'):  # fmt: skip
        agent.script = reply(body)
        _, result = await _timed(rt.agent_metrics(_handle(agent)))
        assert isinstance(result, GuestReplyError), body[:40]


async def test_request_refuses_compressed_replies(agent: FakeAgent,
                                                  machine: tuple[Runtime, Machine]) -> None:
    _, m = machine
    agent.script = reply(gzip.compress(b"{}"), headers=b"content-encoding: gzip\r\n")
    with pytest.raises(GuestReplyError, match="gzip"):
        await agent_replies.request(m.http, "GET", m.slot.url(AGENT_PORT), deadline_s=2)
