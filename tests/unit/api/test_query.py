from __future__ import annotations

from urllib.parse import parse_qsl

import pytest

from aenv.api.query import (
    decode_cursor,
    encode_cursor,
    parse_metadata_filter,
    parse_states,
    parse_time_us,
    rfc3339,
)
from aenv.orchestrator.errors import InvalidRequest
from aenv.orchestrator.states import SandboxState


def test_metadata_filter_spec_example() -> None:
    # e2b-compat.md 2.4: {"a b": "c&d", "k": "v"} as the SDK sends it on the wire
    wire = "metadata=a%252520b%3Dc%252526d%26k%3Dv"
    [(name, value)] = parse_qsl(wire)  # the framework's own decoding
    assert (name, value) == ("metadata", "a%2520b=c%2526d&k=v")
    assert parse_metadata_filter(value) == {"a b": "c&d", "k": "v"}


def test_metadata_filter_plain_and_empty() -> None:
    assert parse_metadata_filter("suite%3Dabc") == {"suite": "abc"}
    assert parse_metadata_filter("suite=abc") == {"suite": "abc"}
    assert parse_metadata_filter("") == {} and parse_metadata_filter(None) == {}
    assert parse_metadata_filter("k=") == {"k": ""}
    with pytest.raises(InvalidRequest):
        parse_metadata_filter("novalue")


def test_metadata_filter_roundtrips_what_the_sdk_encodes() -> None:
    from urllib.parse import quote, urlencode

    md = {"x=y": "a&b", "ü": "100%", "sp ace": "+plus"}
    sdk = urlencode({quote(k): quote(v) for k, v in md.items()})
    assert parse_metadata_filter(sdk) == md


def test_cursor_roundtrip_and_garbage() -> None:
    c = (1_767_225_600_123_456, "abc123")
    tok = encode_cursor(c)
    assert "=" not in tok and decode_cursor(tok) == c
    assert decode_cursor(None) is None and decode_cursor("") is None
    for bad in ("!!!", "Zm9v", encode_cursor((1, "x"))[:-3] + "@@"):
        with pytest.raises(InvalidRequest):
            decode_cursor(bad)


def test_time_parsing_keeps_microseconds() -> None:
    us = parse_time_us("2024-01-01T00:00:00.123456+00:00", "t")
    assert us % 1_000_000 == 123456
    assert parse_time_us("2024-01-01T00:00:00.123456Z", "t") == us
    assert parse_time_us("2024-01-01T01:00:00.123456+01:00", "t") == us
    assert parse_time_us("2024-01-01T01:00:00.123456 01:00", "t") == us  # '+' became ' '
    assert rfc3339(us) == "2024-01-01T00:00:00.123456Z"
    with pytest.raises(InvalidRequest):
        parse_time_us("yesterday", "t")


def test_states() -> None:
    both = parse_states(None)
    assert SandboxState.PAUSED in both and SandboxState.RUNNING in both
    assert SandboxState.PAUSED not in parse_states("running")
    assert parse_states("running,paused") == both
    with pytest.raises(InvalidRequest):
        parse_states("dead")
