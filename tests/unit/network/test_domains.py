"""Domain patterns, and reading the name off a connection's first bytes (real ClientHellos
from Python's TLS stack, real request heads)."""

from __future__ import annotations

import ssl

import pytest

from aenv.network.domains import (
    DomainError,
    NeedMore,
    http_host,
    matches,
    parse_pattern,
    tls_sni,
)


def client_hello(server_name: str | None) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    out, inc = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


@pytest.mark.parametrize(("entry", "want"), [
    ("Example.COM.", "example.com"), ("*.Example.com", "*.example.com"),
    (" a-b.c1.example ", "a-b.c1.example"), ("localhost", "localhost"),
])
def test_patterns_are_normalised(entry: str, want: str) -> None:
    assert parse_pattern(entry) == want


@pytest.mark.parametrize("entry", [
    "*", "*.", "", "a..b", "-a.com", "a-.com", "a_b.com", "*a.com", "a.*.com", "**.a.com",
    "a.com/x", "1.2.3", "x" * 64 + ".com", ".".join(["a" * 63] * 4) + ".com", "é.com",
])
def test_bad_patterns_are_refused(entry: str) -> None:
    with pytest.raises(DomainError):
        parse_pattern(entry)


def test_wildcards_match_below_the_apex_only() -> None:
    pats = ("*.example.com", "api.test")
    assert matches("a.example.com", pats) and matches("a.b.example.com", pats)
    assert not matches("example.com", pats)  # the apex needs its own entry
    assert not matches("badexample.com", pats) and not matches("example.com.evil", pats)
    assert matches("api.test", pats) and not matches("x.api.test", pats)


def test_sni_is_read_from_a_real_client_hello() -> None:
    hello = client_hello("API.example.com")
    assert tls_sni(hello) == "api.example.com"
    for cut in (3, 10, len(hello) - 1):
        with pytest.raises(NeedMore):
            tls_sni(hello[:cut])
    assert tls_sni(client_hello(None)) is None  # no SNI: nothing to allow it by
    assert tls_sni(b"GET / HTTP/1.1\r\n\r\n") is None
    assert tls_sni(b"\x16\x03\x01\x00\x05\x01\x00\x00\xff\xff") is None  # truncated inside


def test_host_is_read_from_a_request_head() -> None:
    assert http_host(b"GET /x HTTP/1.1\r\nHost: Example.com:8080\r\nA: b\r\n\r\n") == (
        "example.com")
    assert http_host(b"GET / HTTP/1.0\r\nhost:a.test\r\n\r\nbody") == "a.test"
    with pytest.raises(NeedMore):
        http_host(b"GET / HTTP/1.1\r\nHost: a.test\r\n")
    assert http_host(b"GET / HTTP/1.1\r\n\r\n") is None  # no Host
    assert http_host(b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n") is None
    assert http_host(b"\x16\x03\x01junk\r\n\r\n") is None
    assert http_host(b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n") is None
    assert http_host(b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * 5000) is None  # too long
