"""The SOCKS5 client of `egressProxy` (network/socks.py) against real servers on loopback:
Dante without and with RFC 1929 credentials, and stunnel in front of Dante for TLS."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aenv.network.relay import Tunnel
from aenv.network.socks import SocksConfigError, SocksProxy, dial, resolve
from tests.support.host import free_port
from tests.support.internet import HttpServer
from tests.support.socks import PASSWORD, USER, Dante, Stunnel
from tests.support.tls import make_certs

pytestmark = pytest.mark.timeout(120)
LO = ipaddress.IPv4Address("127.0.0.1")


@dataclass
class Servers:
    web: int
    plain: int
    creds: int
    tls: int
    ca: str
    dante: Dante


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    tmp = tmp_path_factory.mktemp("socks")
    certs = make_certs(tmp / "certs", "socks.test")
    web = HttpServer(free_port(), lambda peer: f"from {peer}".encode(), "127.0.0.1")
    plain = Dante("127.0.0.1", free_port(), tmp)
    creds = Dante("127.0.0.1", free_port(), tmp, credentials=True)
    tls_port = free_port()
    tls = Stunnel("127.0.0.1", tls_port, f"127.0.0.1:{_port(creds)}",
                  certs.cert, certs.key, tmp)
    try:
        yield Servers(web.server.server_address[1], _port(plain), _port(creds), tls_port,
                      certs.ca.read_text(), plain)
    finally:
        for s in (tls, creds, plain, web):
            s.close()


def _port(d: Dante) -> int:
    return int(d.log.name.removeprefix("danted-").removesuffix(".log"))


async def _get(t: Tunnel, host: str = "127.0.0.1") -> bytes:
    req = f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    if t.sock is not None:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(t.sock, req)
        out = b""
        while chunk := await loop.sock_recv(t.sock, 65536):
            out += chunk
        t.close()
    else:
        assert t.writer is not None and t.reader is not None
        t.writer.write(req)
        out = await t.reader.read()
        t.close()
    return out.split(b"\r\n\r\n", 1)[1]


def _proxy(port: int, **kw: object) -> SocksProxy:
    return SocksProxy.from_request({"address": f"127.0.0.1:{port}", **kw})


async def test_plain_by_address_and_by_name(servers: Servers) -> None:
    before = servers.dante.connects()
    t = await dial(_proxy(servers.plain), LO, "127.0.0.1", servers.web)
    assert await _get(t) == b"from 127.0.0.1"
    t = await dial(_proxy(servers.plain), LO, "localhost", servers.web)  # the proxy resolves
    assert await _get(t) == b"from 127.0.0.1"
    assert servers.dante.connects() == before + 2


async def test_credentials_are_needed_and_checked(servers: Servers) -> None:
    good = _proxy(servers.creds, username=USER, password=PASSWORD)
    assert await _get(await dial(good, LO, "127.0.0.1", servers.web)) == b"from 127.0.0.1"
    for bad in (_proxy(servers.creds), _proxy(servers.creds, username=USER, password="no")):
        with pytest.raises(OSError):
            await dial(bad, LO, "127.0.0.1", servers.web)


async def test_tls_to_the_proxy_is_verified(servers: Servers) -> None:
    good = _proxy(servers.tls, username=USER, password=PASSWORD,
                  tls={"enabled": True, "serverName": "api.socks.test", "caCert": servers.ca})
    t = await dial(good, LO, "127.0.0.1", servers.web)
    assert t.sock is None  # a TLS session, relayed through streams
    assert await _get(t) == b"from 127.0.0.1"
    for bad in ({"enabled": True, "caCert": servers.ca},  # 127.0.0.1 is not the cert's name
                {"enabled": True, "serverName": "api.socks.test"},  # the system store
                {"enabled": True, "serverName": "other.example", "caCert": servers.ca}):
        with pytest.raises(OSError):
            await dial(_proxy(servers.tls, username=USER, password=PASSWORD, tls=bad), LO,
                       "127.0.0.1", servers.web)
    with pytest.raises(OSError):  # TLS spoken to a proxy in the clear
        await dial(_proxy(servers.plain, tls=True), LO, "127.0.0.1", servers.web)


async def test_a_dead_proxy_fails_and_internal_addresses_are_refused(servers: Servers) -> None:
    with pytest.raises(OSError):
        await dial(_proxy(free_port()), LO, "127.0.0.1", servers.web)
    with pytest.raises(SocksConfigError, match="internal address"):
        await resolve(_proxy(servers.plain), [ipaddress.IPv4Network("127.0.0.0/8")])
    assert await resolve(_proxy(servers.plain), []) == LO


def test_configs_round_trip(tmp_path: Path) -> None:
    p = _proxy(1080, username="u", password="p",
               tls={"enabled": True, "serverName": "s.example", "caCert": None})
    assert SocksProxy.from_request(p.to_json()) == p
    assert p.info() == {"address": "127.0.0.1:1080", "username": "u",
                        "tls": {"enabled": True, "serverName": "s.example"}}
