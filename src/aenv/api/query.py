"""Decoding `GET /v2/sandboxes` query parameters: metadata filter, cursor, time, state."""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime
from urllib.parse import unquote

from fastapi import Request, Response

from aenv.api.cluster_caller import from_cluster
from aenv.cluster import wire
from aenv.orchestrator.errors import InvalidRequest
from aenv.orchestrator.states import SandboxState, states_for_public


def parse_metadata_filter(value: str | None) -> dict[str, str]:
    """E2B's double-encoded filter (infra's parseFilters).

    After the framework's own decoding the value is e.g. `a%2520b=c%2526d&k=v`: unescape it
    once more, split on `&` and `=`, then unescape each key and value.
    """
    if not value:
        return {}
    out: dict[str, str] = {}
    for pair in unquote(value).split("&"):
        if not pair:
            continue
        key, sep, val = pair.partition("=")
        if not sep:
            raise InvalidRequest(f"invalid metadata filter {pair!r}: expected key=value")
        out[unquote(key)] = unquote(val)
    return out


def encode_cursor(cursor: tuple[int, str]) -> str:
    raw = f"{cursor[0]}__{cursor[1]}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def cluster_cursors(request: Request, response: Response,
                    cursors: list[tuple[int, str]]) -> None:  # fmt: skip
    """Give a cluster gateway each listed item's cursor (`cluster/wire.py`)."""
    if from_cluster(request):
        response.headers[wire.CURSORS_HEADER] = ",".join(encode_cursor(c) for c in cursors)


def decode_cursor(token: str | None) -> tuple[int, str] | None:
    if not token:
        return None
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        ts, sep, sid = raw.partition("__")
        if not sep or not sid:
            raise ValueError
        return int(ts), sid
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidRequest("invalid nextToken") from None


def parse_time_us(value: str, name: str) -> int:
    """RFC 3339 / ISO 8601 (offset optional, UTC assumed) to Unix microseconds."""
    text = value.strip().replace(" ", "+")  # a raw '+' in a query string arrives as a space
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidRequest(f"invalid {name}: expected an RFC 3339 time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def parse_states(value: str | None) -> frozenset[SandboxState]:
    if not value:
        return states_for_public("running") | states_for_public("paused")
    out: set[SandboxState] = set()
    for part in value.split(","):
        part = part.strip().lower()
        if part not in ("running", "paused"):
            raise InvalidRequest(f"invalid state {part!r}: expected running or paused")
        out |= states_for_public(part)
    return frozenset(out)


def rfc3339(us: int) -> str:
    """Unix microseconds to RFC 3339 UTC with full microsecond precision."""
    dt = datetime.fromtimestamp(us // 1_000_000, UTC).replace(microsecond=us % 1_000_000)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
