"""The egress proxy on loopback addresses (127.78.0.0/24): a real dnsmasq answering for the
domain, a real upstream that echoes, clients bound to a tenant's address as a guest is after
its slot's DNAT. Needs root (port 53 and 80 on loopback addresses)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from aenv.network.egress import ALL, EgressPolicy, EgressSets
from aenv.network.egress_proxy import EgressProxy, Hairpin
from tests.support.internet import Dnsmasq

UPSTREAM, DNS, LOCAL, TENANT = "127.78.0.1", "127.78.0.53", "127.78.0.2", "127.78.0.3"
NAME = "api.proxy.test"
# As compile_sets makes them for a policy with a domain, except that loopback, "never" to a
# real sandbox, is open here.
OPEN = EgressSets(never=(), allow_special=(), special=(), allow_out=(), deny_out=(),
                  allow_default=(), proxied=(ipaddress.IPv4Network("0.0.0.0/0"),))


@pytest.fixture(scope="module")
def dns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    d = Dnsmasq(DNS, {NAME: UPSTREAM, f"private.{NAME}": "127.0.0.1"},
                Path(tmp_path_factory.mktemp("dns")))
    yield
    d.close()


async def _echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
        w.write_eof()  # the half-close came through: say so, then close
    w.close()


@pytest.fixture
async def proxy(dns: None) -> AsyncIterator[EgressProxy]:
    upstream = await asyncio.start_server(_echo, UPSTREAM, 80, reuse_address=True)
    p = EgressProxy()
    await p.start()
    p.admit(TENANT, EgressPolicy.from_request(False, [NAME], dns_servers=[DNS]), OPEN)
    try:
        yield p
    finally:
        await p.close()
        upstream.close()
        await upstream.wait_closed()


async def _open(p: EgressProxy, host: str, source: str = TENANT, to: str = LOCAL
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:  # fmt: skip
    r, w = await asyncio.open_connection(to, p.ports[0], local_addr=(source, 0))
    w.write(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    return r, w


async def _reset(r: asyncio.StreamReader) -> bool:
    try:
        return await asyncio.wait_for(r.read(100), 5) == b""
    except ConnectionResetError:
        return True


async def test_an_allowed_name_is_relayed_both_ways_with_its_half_close(
        proxy: EgressProxy) -> None:  # fmt: skip
    r, w = await _open(proxy, f"{NAME}:80")
    head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
    assert head == f"GET / HTTP/1.1\r\nHost: {NAME}:80\r\n\r\n".encode()  # replayed as read
    blob = bytes(range(256)) * 4096  # 1 MiB: more than a pipe holds unless enlarged
    w.write(blob)
    w.write_eof()
    assert await asyncio.wait_for(r.read(), 10) == blob  # EOF arrives after all of it
    w.close()


@pytest.mark.parametrize(("host", "source", "to"), [
    ("other.proxy.test", TENANT, LOCAL),  # not allowed
    (f"private.{NAME}", TENANT, LOCAL),  # below an exact entry: not allowed
    (NAME, "127.78.0.5", "127.78.0.4"),  # a source that is no tenant
    (NAME, TENANT, "127.78.0.9"),  # the tenant, but not through its own /30's host end
])
async def test_what_is_not_allowed_is_reset(proxy: EgressProxy, host: str, source: str,
                                            to: str) -> None:  # fmt: skip
    r, w = await _open(proxy, host, source, to)
    assert await _reset(r)
    w.close()


async def test_a_name_resolving_to_a_closed_address_is_refused(proxy: EgressProxy) -> None:
    closed = dataclasses.replace(OPEN, never=(ipaddress.IPv4Network("127.0.0.0/24"),))
    proxy.admit(TENANT, EgressPolicy.from_request(False, [f"*.{NAME}"], dns_servers=[DNS]),
                closed)  # fmt: skip
    r, w = await _open(proxy, f"private.{NAME}")
    assert await _reset(r)
    w.close()


async def test_an_update_that_takes_the_name_away_resets_it_and_one_that_keeps_it_does_not(
        proxy: EgressProxy) -> None:  # fmt: skip
    r, w = await _open(proxy, NAME)
    await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
    keep = EgressPolicy.from_request(False, [NAME, "b.test"], dns_servers=[DNS])
    proxy.admit(TENANT, keep, OPEN)
    w.write(b"still there")
    assert await asyncio.wait_for(r.readexactly(11), 5) == b"still there"
    w.write_eof()  # it ends under the tenant that replaced the one it began under
    assert await asyncio.wait_for(r.read(), 5) == b""
    await asyncio.sleep(0.1)
    assert proxy._tenants[TENANT].conns == {}  # nothing kept of it
    w.close()
    r, w = await _open(proxy, NAME)
    await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
    proxy.admit(TENANT, EgressPolicy.from_request(False, ["b.test"], dns_servers=[DNS]), OPEN)
    assert await _reset(r)
    w.close()
    r, w = await _open(proxy, NAME)  # and new ones are refused too
    assert await _reset(r)
    w.close()


async def test_the_hairpin_goes_to_the_node_for_its_sandbox_urls_only(dns: None) -> None:
    echo = await asyncio.start_server(_echo, UPSTREAM, 8123, reuse_address=True)
    p = EgressProxy(hairpin=Hairpin("sbx.proxy.test", UPSTREAM, 8123, tls=False))
    await p.start()
    pinned = dataclasses.replace(OPEN, hairpin=(ALL,))
    try:
        p.admit(TENANT, EgressPolicy.from_request(True), pinned)
        r, w = await _open(p, "8000-abc123.sbx.proxy.test")
        assert (await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)).startswith(b"GET / ")
        w.close()
        for host in ("api.sbx.proxy.test", "8000-abc.other.test", "x-abc.sbx.proxy.test"):
            r, w = await _open(p, host)
            assert await _reset(r), host
            w.close()
        # Closed to public destinations, no matching domain: no hairpin.
        p.admit(TENANT, EgressPolicy.from_request(False, ["b.test"], dns_servers=[DNS]),
                OPEN)  # fmt: skip
        r, w = await _open(p, "8000-abc123.sbx.proxy.test")
        assert await _reset(r)
        w.close()
    finally:
        await p.close()
        echo.close()
        await echo.wait_closed()
