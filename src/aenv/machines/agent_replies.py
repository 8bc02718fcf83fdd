"""Reading what a guest's agent answers: bounded, strict, never trusted.

The guest runs untrusted code as root, so its agent's replies are hostile input. Every
exchange here has one deadline for the whole of it (connect, head, body: a guest that
trickles a byte a second is cut off) and a byte cap on the body (a guest that answers
endlessly or hugely costs at most that much memory). Compressed bodies are refused (no
decompression bombs); the head is capped by httpx/h11 (100 KiB). JSON is parsed without
NaN/Infinity, and metrics are checked against a schema with numeric ranges. Whatever goes
wrong is a `GuestReplyError`: callers decide whether it fails an operation (/init) or is a
skipped sample (/metrics), never a node crash.

    reply = await request(m.http, "GET", url, deadline_s=2.0)
    metrics = AgentMetrics.parse(reply)
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aenv.machines.api import RuntimeError_

# Agent replies the node reads are small JSON documents (/metrics is ~200 bytes).
MAX_REPLY_BYTES = 64 * 1024
# Upper bound of any byte count a guest may report (1 PiB): far above any real VM, far
# below what SQLite's INTEGER (int64) or a JSON consumer's float64 would mangle.
MAX_REPORTED_BYTES = 1 << 50
MAX_REPORTED_CPUS = 1024


class GuestReplyError(RuntimeError_):
    """The guest's agent did not answer usably: unreachable, too slow, too big, malformed."""

    status = 502


@dataclass(frozen=True, slots=True)
class AgentReply:
    status: int
    body: bytes

    def snippet(self, n: int = 200) -> str:
        """The start of the body, for an error message."""
        return self.body[:n].decode(errors="replace")

    def json_object(self) -> dict[str, Any]:
        """The body as a JSON object; NaN and ±Infinity are not JSON and are refused."""
        try:
            data = json.loads(self.body, parse_constant=_no_constant)
        except (ValueError, RecursionError) as e:  # RecursionError: absurdly deep nesting
            raise GuestReplyError(f"agent sent malformed JSON: {str(e)[:120]}") from None
        if not isinstance(data, dict):
            raise GuestReplyError(f"agent sent a JSON {type(data).__name__}, not an object")
        return data


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


async def request(
    client: httpx.AsyncClient, method: str, url: str, *, deadline_s: float,
    max_bytes: int = MAX_REPLY_BYTES, **kwargs: Any,
) -> AgentReply:  # fmt: skip
    """One request to the agent; the whole exchange must fit in `deadline_s` and the body in
    `max_bytes`. Raises GuestReplyError (transport errors included)."""
    headers = {**kwargs.pop("headers", {}), "Accept-Encoding": "identity"}
    try:
        async with asyncio.timeout(deadline_s):
            async with client.stream(method, url, headers=headers, timeout=deadline_s,
                                     **kwargs) as r:  # fmt: skip
                encoding = r.headers.get("content-encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):
                    raise GuestReplyError(f"agent sent a {encoding[:20]!r}-encoded reply")
                body = bytearray()
                # Identity-encoded (checked above), so these are the raw bytes.
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise GuestReplyError(f"agent reply exceeds {max_bytes} bytes")
                return AgentReply(r.status_code, bytes(body))
    except TimeoutError:
        raise GuestReplyError(f"agent gave no complete reply within {deadline_s:g} s") from None
    except httpx.HTTPError as e:
        raise GuestReplyError(f"agent request failed: {type(e).__name__}: {e}") from None


async def get_object(client: httpx.AsyncClient, url: str, token: str | None, *,
                     deadline_s: float, max_bytes: int = MAX_REPLY_BYTES) -> dict[str, Any]:
    """GET a JSON object from the agent (its access token, if any); anything but a 200 is
    GuestReplyError."""
    headers = {"X-Access-Token": token} if token else {}
    r = await request(client, "GET", url, headers=headers, deadline_s=deadline_s,
                      max_bytes=max_bytes)
    if r.status != 200:
        raise GuestReplyError(f"agent {url.split('/', 3)[-1]} answered {r.status}: "
                              f"{r.snippet()}")
    return r.json_object()


ReportedBytes = Annotated[int, Field(ge=0, le=MAX_REPORTED_BYTES)]


class AgentMetrics(BaseModel):
    """The agent's `GET /metrics` (docs/agent.md), range-checked. Strict types: a string or a
    bool is not a number; unknown keys are ignored (a newer agent may add some)."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, frozen=True)

    cpu_count: int = Field(1, ge=1, le=MAX_REPORTED_CPUS)
    cpu_used_pct: float = Field(0.0, ge=0.0, le=100.0)
    mem_used: ReportedBytes = 0
    mem_total: ReportedBytes = 0
    mem_cache: ReportedBytes = 0
    disk_used: ReportedBytes = 0
    disk_total: ReportedBytes = 0

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> AgentMetrics:
        return _validated(cls, raw, "metrics")


class GuestLogEntry(BaseModel):
    """One entry of the agent's `GET /aenv/logs` (guest/agent/journal.py), bounded: what a
    guest says goes into the node's database."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    seq: int = Field(ge=1, le=1 << 62)
    tsUs: int = Field(ge=0, le=1 << 62)
    level: Literal["debug", "info", "warn", "error"]
    message: str = Field(max_length=4096)
    fields: dict[Annotated[str, Field(max_length=64)],
                 Annotated[str, Field(max_length=256)]] = Field(max_length=8)


class GuestLogs(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    entries: list[GuestLogEntry] = Field(max_length=500)
    next: int = Field(ge=0, le=1 << 62)

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> GuestLogs:
        return _validated(cls, raw, "logs")


_M = TypeVar("_M", bound=BaseModel)


def _validated(model: type[_M], raw: dict[str, Any], what: str) -> _M:
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise GuestReplyError(f"agent {what} rejected: {where}: {first['msg']}") from None
