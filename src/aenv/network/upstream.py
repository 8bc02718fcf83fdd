"""How the node connects onward for a guest's connection, once it is allowed: to a name
(resolved through the sandbox's `dnsServers`, every address checked against the never and
special ranges again) or to the guest's own destination, directly or through the sandbox's
SOCKS5 `egressProxy` (a name then goes to the proxy, which resolves it). Shared by the
node's egress proxy (`egress_proxy.py`) and the slots' listeners (`tunnels.py`).

Also where a connection's first bytes are read to name its destination (`domains.py`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from dataclasses import dataclass, field

import dns.asyncresolver
import dns.exception
import dns.resolver

from aenv.network.domains import MAX_HEAD, MAX_HELLO, NeedMore, http_host, tls_sni
from aenv.network.egress import EgressPolicy, EgressSets, refused_by_address
from aenv.network.relay import Tunnel
from aenv.network.socks import SocksConfigError, SocksProxy, dial, resolve

log = logging.getLogger(__name__)

RESOLVE_TIMEOUT_S = 3.0
CONNECT_TIMEOUT_S = 10.0
FIRST_BYTES_TIMEOUT_S = 10.0  # a guest that connects and says nothing holds nothing long
_PEEK_WAIT_S = 0.005


def _resolver(servers: tuple[str, ...]) -> dns.asyncresolver.Resolver:
    r = dns.asyncresolver.Resolver(configure=False)
    r.nameservers = list(servers)
    r.lifetime = RESOLVE_TIMEOUT_S
    r.cache = dns.resolver.LRUCache(1024)  # per sandbox: its servers may answer differently
    return r


@dataclass
class Upstream:
    """One sandbox's way out, as its policy says (the sets it was compiled to)."""

    sets: EgressSets
    proxy: SocksProxy | None
    resolver: dns.asyncresolver.Resolver = field(repr=False)

    @classmethod
    def of(cls, policy: EgressPolicy, sets: EgressSets) -> Upstream:
        return cls(sets, policy.egress_proxy, _resolver(policy.resolvers))

    def same_way(self, other: Upstream) -> bool:
        """Open connections made by `other` still go where this one would send them."""
        return self.proxy == other.proxy and (
            self.resolver.nameservers == other.resolver.nameservers)

    async def to_name(self, name: str, port: int) -> tuple[Tunnel | None, str]:
        """(the connection or None, the outcome for the counters)."""
        if self.proxy is not None:  # the proxy resolves (ATYP domain)
            return await self._through(name, port), "tunnelled"
        addrs = await self._resolve(name)
        allowed = [a for a in addrs if not refused_by_address(a, self.sets)]
        if not allowed:
            return None, "unresolved" if not addrs else "address_refused"
        return await connect(allowed, port), "relayed"

    async def to_address(self, addr: ipaddress.IPv4Address, port: int) -> Tunnel | None:
        if self.proxy is not None:
            return await self._through(str(addr), port)
        return await connect([addr], port)

    async def _through(self, dest: str, port: int) -> Tunnel | None:
        assert self.proxy is not None
        try:
            addr = await resolve(self.proxy, (*self.sets.never, *self.sets.special))
            return await dial(self.proxy, addr, dest, port)
        except (OSError, SocksConfigError) as e:
            log.info("egress: %s:%d through %s: %s", dest, port, self.proxy.address, e)
            return None  # fail closed

    async def _resolve(self, name: str) -> list[ipaddress.IPv4Address]:
        try:
            answer = await self.resolver.resolve(name, "A")
        except (dns.exception.DNSException, OSError):
            return []
        return [ipaddress.IPv4Address(r.address) for r in answer]


async def connect(addrs: list[ipaddress.IPv4Address], port: int) -> Tunnel | None:
    loop = asyncio.get_running_loop()
    for a in addrs:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        try:
            await asyncio.wait_for(loop.sock_connect(s, (str(a), port)), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            s.close()
            continue
        return Tunnel(sock=s)
    return None


async def first_bytes(conn: socket.socket, port: int, *, peek: bool = False
                      ) -> tuple[bytes, str | None]:  # fmt: skip
    """The connection's first bytes and the name they carry (TLS SNI on 443, else the
    HTTP/1 Host), None if they carry none. `peek`: leave them in the socket (whoever
    terminates TLS next must read the ClientHello itself)."""
    loop = asyncio.get_running_loop()
    parse, limit = (tls_sni, MAX_HELLO) if port == 443 else (http_host, MAX_HEAD)
    head = b""
    while True:
        if peek:
            await _readable(loop, conn)
            chunk = conn.recv(limit, socket.MSG_PEEK)
            if not chunk:
                return head, None
            if chunk == head:  # nothing new yet: the rest of a split hello is on its way
                await asyncio.sleep(_PEEK_WAIT_S)
                continue
            head = chunk
        else:
            chunk = await loop.sock_recv(conn, 4096)
            head += chunk
        if not chunk:
            return head, None
        try:
            return head, parse(head)
        except NeedMore:
            if len(head) >= limit:
                return head, None


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    fut: asyncio.Future[None] = loop.create_future()
    loop.add_reader(sock.fileno(), lambda: fut.done() or fut.set_result(None))
    try:
        await fut
    finally:
        loop.remove_reader(sock.fileno())
