"""A sandbox's `egressProxy`: E2B's "bring your own proxy", SOCKS5 (RFC 1928) with optional
RFC 1929 credentials and an optional TLS hop to the proxy.

Tunnelling happens on the host after the allow/deny order (`egress.py`): the guest's TCP
connections that the order accepts are taken by the slot's tunnel listener (`tunnels.py`)
and dialled through the proxy; those the egress proxy lets through by domain are dialled
through it by name (ATYP domain: the proxy resolves). DNS and other UDP are not tunnelled.
Egress fails closed: when the proxy cannot be reached or refuses, the guest's connection
is reset, never sent out directly.

The proxy's host is resolved by the node (its own resolver) at every dial and the address
pinned for that connection; one that resolves into a never or special range (egress.py) is
refused, at create and update too, as E2B refuses proxies inside its infrastructure.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from python_socks import ProxyError, ProxyType
from python_socks.async_.asyncio import Proxy
from python_socks.async_.asyncio.v2 import Proxy as StreamProxy

from aenv.network.relay import Tunnel

MAX_CRED = 255  # bytes, RFC 1929
MAX_SERVER_NAME = 253
MAX_CA_CERT = 8192
DIAL_TIMEOUT_S = 10.0


class SocksConfigError(ValueError):
    """An egressProxy this node will not use."""


@dataclass(frozen=True)
class SocksProxy:
    host: str
    port: int
    username: str | None = None
    password: str | None = None
    tls: bool = False
    server_name: str | None = None  # TLS: the name verified and sent as SNI (default: host)
    ca_cert: str | None = None  # TLS: PEM CAs that replace the system store

    @classmethod
    def from_request(cls, body: object) -> SocksProxy:
        """From E2B's `SandboxEgressProxyConfig` (camelCase keys); SocksConfigError."""
        if not isinstance(body, Mapping):
            raise SocksConfigError("network.egressProxy must be an object with an address")
        host, port = _address(body.get("address"))
        user, pw = body.get("username"), body.get("password")
        for key, v in (("username", user), ("password", pw)):
            if v is not None and (not isinstance(v, str) or not v
                                  or len(v.encode()) > MAX_CRED):  # fmt: skip
                raise SocksConfigError(f"network.egressProxy.{key} must be a string of 1 to "
                                       f"{MAX_CRED} bytes")
        if pw is not None and user is None:
            raise SocksConfigError("network.egressProxy.password needs a username")
        tls, name, ca = _tls(body.get("tls"))
        return cls(host, port, user, pw, tls, name, ca)

    def to_json(self) -> dict[str, Any]:
        """Everything, for the node's own record (it dials with it)."""
        d: dict[str, Any] = {"address": self.address}
        if self.username is not None:
            d["username"] = self.username
        if self.password is not None:
            d["password"] = self.password
        if self.tls:
            d["tls"] = {"enabled": True, "serverName": self.server_name, "caCert": self.ca_cert}
        return d

    def info(self) -> dict[str, Any]:
        """As the sandbox info reports it: never the password or the CA (E2B's rule)."""
        d: dict[str, Any] = {"address": self.address}
        if self.username is not None:
            d["username"] = self.username
        if self.tls:
            d["tls"] = {"enabled": True}
            if self.server_name:
                d["tls"]["serverName"] = self.server_name
        return d

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def ssl_context(self) -> ssl.SSLContext:
        """TLS 1.2 or newer, the certificate always verified, against `server_name`."""
        ctx = _Named(ssl.PROTOCOL_TLS_CLIENT)
        ctx.name = self.server_name or self.host
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ca_cert:
            ctx.load_verify_locations(cadata=self.ca_cert)
        else:
            ctx.load_default_certs()
        return ctx


class _Named(ssl.SSLContext):
    """Verifies and sends `name` whatever the caller passes: the connection goes to the
    pinned address, and python-socks would name the certificate after that."""

    name = ""

    def wrap_bio(self, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO,
                 server_side: bool = False, server_hostname: str | None = None,
                 session: ssl.SSLSession | None = None) -> ssl.SSLObject:  # fmt: skip
        return super().wrap_bio(incoming, outgoing, server_side, self.name, session)


def _address(v: object) -> tuple[str, int]:
    if not isinstance(v, str) or not v:
        raise SocksConfigError("network.egressProxy.address must be a host:port string")
    host, sep, port = v.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SocksConfigError(f"network.egressProxy.address: {v!r} is not host:port")
    try:
        literal: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:  # a host name
        literal = None
        if len(host) > MAX_SERVER_NAME or not all(
                p and len(p) < 64 and p.replace("-", "").isalnum() for p in host.split(".")):
            raise SocksConfigError(f"network.egressProxy.address: {host!r} is not a host "
                                   "name") from None
    if literal is not None and literal.version == 6:
        raise SocksConfigError(f"network.egressProxy.address: {v!r} is IPv6; the node dials "
                               "IPv4 only")
    return host.lower(), int(port)


def _tls(v: object) -> tuple[bool, str | None, str | None]:
    if v is None or v is False:
        return False, None, None
    if v is True:
        return True, None, None
    if not isinstance(v, Mapping):
        raise SocksConfigError("network.egressProxy.tls must be true, false or an object")
    unknown = set(v) - {"enabled", "serverName", "caCert"}
    if unknown:
        raise SocksConfigError(f"network.egressProxy.tls.{sorted(unknown)[0]} is not a field")
    enabled, name, ca = v.get("enabled", True), v.get("serverName"), v.get("caCert")
    if not isinstance(enabled, bool):
        raise SocksConfigError("network.egressProxy.tls.enabled must be a boolean")
    if not enabled:
        if name is not None or ca is not None:
            raise SocksConfigError("network.egressProxy.tls: no other field may be set when "
                                   "enabled is false")
        return False, None, None
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= MAX_SERVER_NAME):
        raise SocksConfigError(f"network.egressProxy.tls.serverName must be 1 to "
                               f"{MAX_SERVER_NAME} characters")
    if ca is not None:
        if not isinstance(ca, str) or len(ca.encode()) > MAX_CA_CERT:
            raise SocksConfigError(f"network.egressProxy.tls.caCert must be PEM of at most "
                                   f"{MAX_CA_CERT} bytes")
        try:
            ssl.create_default_context(cadata=ca)
        except (ssl.SSLError, ValueError):
            raise SocksConfigError("network.egressProxy.tls.caCert holds no PEM certificate "
                                   "this node can read") from None
    return True, name, ca


async def resolve(proxy: SocksProxy, refused: Iterable[ipaddress.IPv4Network]
                  ) -> ipaddress.IPv4Address:  # fmt: skip
    """The address to dial now: the host's first IPv4 address outside `refused`;
    SocksConfigError if it has none."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            proxy.host, proxy.port, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except OSError:
        raise SocksConfigError(f"network.egressProxy: {proxy.host!r} does not resolve") from None
    nets = tuple(refused)
    addrs = [ipaddress.IPv4Address(i[4][0]) for i in infos]
    for a in addrs:
        if not any(a in n for n in nets):
            return a
    raise SocksConfigError(f"network.egressProxy: {proxy.host!r} resolves to {addrs[0]}, "
                           "an internal address this node does not dial")


async def dial(proxy: SocksProxy, addr: ipaddress.IPv4Address, dest: str, port: int
               ) -> Tunnel:  # fmt: skip
    """A CONNECT to `dest` (an address, or a name the proxy resolves) through the proxy at
    `addr`; raises OSError (ProxyError included) on any failure."""
    args = dict(proxy_type=ProxyType.SOCKS5, host=str(addr), port=proxy.port,
                username=proxy.username, password=proxy.password, rdns=True)
    try:
        if not proxy.tls:
            sock = await Proxy(**args).connect(dest, port, timeout=DIAL_TIMEOUT_S)
            sock.setblocking(False)
            return Tunnel(sock=sock)
        stream = await StreamProxy(**args, proxy_ssl=proxy.ssl_context()).connect(
            dest, port, timeout=DIAL_TIMEOUT_S)
        return Tunnel(reader=stream.reader, writer=stream.writer)
    except ProxyError as e:
        raise ConnectionRefusedError(f"egress proxy {proxy.address}: {e}") from e
    except (ssl.SSLError, TimeoutError) as e:
        raise ConnectionRefusedError(f"egress proxy {proxy.address}: {e}") from e
