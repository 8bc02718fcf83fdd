"""The node's egress proxy: HTTP and TLS connections a guest may make by domain name only.

A slot whose policy holds a domain sends the guest's TCP 80 and 443 connections that its
address rules would refuse here instead (rules.py, `proxy_pick`), DNAT-ed to the host end
of its veth. One listener per guest port, on the host; a connection is judged by who sent
it (the slot address, which only that slot's namespace can use: it is the far end of the
connected /30, and the reply goes back down that veth):

1. the sandbox's policy must hold a domain (else: no tenant, reset);
2. the first bytes name the destination: the TLS ClientHello's SNI, the HTTP/1 Host
   (`domains.py`), and the name must match an allowed pattern;
3. the name is resolved through the policy's `dnsServers` (never the host's resolver), and
   every address it resolves to passes egress.py's steps 1 and 2 again (a name that points
   at a private or the node's own address is refused unless that range is named);
4. the proxy connects there, on the same port, replays the bytes it read and relays both
   ways. It never decrypts, never changes a byte, and never connects to the address the
   guest chose (a direct-IP connection with an allowed SNI reaches the name's own address).

Refused connections are reset: the guest sees its connect succeed and then ECONNRESET,
as E2B documents for its own blocked connections. A live update that takes a name away
resets the open connections to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from dataclasses import dataclass, field

import dns.asyncresolver
import dns.exception
import dns.resolver
from prometheus_client import Counter

from aenv.network.domains import MAX_HEAD, MAX_HELLO, NeedMore, http_host, matches, tls_sni
from aenv.network.egress import EgressPolicy, EgressSets, refused_by_address
from aenv.network.rules import PROXIED_PORTS

log = logging.getLogger(__name__)

CONNECTIONS = Counter("aenv_egress_proxy_connections_total",
                      "Guest connections through the egress proxy by outcome", ["outcome"])
FIRST_BYTES_TIMEOUT_S = 10.0  # a guest that connects and says nothing holds nothing long
RESOLVE_TIMEOUT_S = 3.0
CONNECT_TIMEOUT_S = 10.0
CHUNK = 256 * 1024


@dataclass
class _Tenant:
    domains: tuple[str, ...]
    sets: EgressSets
    resolver: dns.asyncresolver.Resolver
    conns: dict[asyncio.Task[None], str] = field(default_factory=dict)  # relay -> name


def _resolver(servers: tuple[str, ...]) -> dns.asyncresolver.Resolver:
    r = dns.asyncresolver.Resolver(configure=False)
    r.nameservers = list(servers)
    r.lifetime = RESOLVE_TIMEOUT_S
    r.cache = dns.resolver.LRUCache(1024)  # per sandbox: its servers may answer differently
    return r


def _is_own_peer(local: str, peer: str) -> bool:
    """The peer is the slot end of the /30 whose host end it connected to."""
    try:
        return ipaddress.IPv4Address(local) + 1 == ipaddress.IPv4Address(peer)
    except ValueError:
        return False


class EgressProxy:
    def __init__(self, host: str = "0.0.0.0") -> None:
        # Bound on every host address, yet it serves only slots it was told of (admit).
        self._host = host
        self._servers: list[asyncio.Server] = []
        self._tenants: dict[str, _Tenant] = {}

    @property
    def ports(self) -> tuple[int, ...]:
        """The listening port for each guest port of rules.PROXIED_PORTS; () until started."""
        return tuple(s.sockets[0].getsockname()[1] for s in self._servers)

    async def start(self) -> None:
        for guest_port in PROXIED_PORTS:
            async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter,
                            port: int = guest_port) -> None:  # fmt: skip
                await self._serve(r, w, port)

            self._servers.append(await asyncio.start_server(serve, self._host, 0))

    async def close(self) -> None:
        for s in self._servers:
            s.close()
        for t in list(self._tenants):
            self.forget(t)
        for s in self._servers:
            with contextlib.suppress(Exception):
                await s.wait_closed()
        self._servers.clear()

    def admit(self, slot_addr: str, policy: EgressPolicy, sets: EgressSets | None) -> None:
        """The policy now on the slot at `slot_addr`: its domains are served from now on,
        and its open connections to names no longer allowed are reset."""
        if sets is None or not policy.domains:
            self.forget(slot_addr)
            return
        old = self._tenants.get(slot_addr)
        t = _Tenant(policy.domains, sets, _resolver(policy.resolvers))
        if old is not None:
            for task, name in old.conns.items():
                if matches(name, t.domains) and old.resolver.nameservers == t.resolver.nameservers:
                    t.conns[task] = name
                else:
                    task.cancel()
        self._tenants[slot_addr] = t

    def forget(self, slot_addr: str) -> None:
        """The slot was released or closed: reset what it has open."""
        t = self._tenants.pop(slot_addr, None)
        if t is not None:
            for task in t.conns:
                task.cancel()

    # --- one connection ------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     port: int) -> None:  # fmt: skip
        peer = writer.get_extra_info("peername")[0]
        local = writer.get_extra_info("sockname")[0]
        tenant = self._tenants.get(peer) if _is_own_peer(local, peer) else None
        if tenant is None:
            return self._refuse(writer, "no_tenant")
        try:
            head, name = await asyncio.wait_for(self._first_bytes(reader, port),
                                                FIRST_BYTES_TIMEOUT_S)  # fmt: skip
        except (TimeoutError, ConnectionError):
            return self._refuse(writer, "no_name")
        if name is None or not matches(name, tenant.domains):
            log.debug("egress proxy: %s refused %s:%d", peer, name, port)
            return self._refuse(writer, "not_allowed")
        addrs = await self._resolve(tenant, name)
        allowed = [a for a in addrs if not refused_by_address(a, tenant.sets)]
        if not allowed:
            return self._refuse(writer, "unresolved" if not addrs else "address_refused")
        upstream = await self._connect(allowed, port)
        if upstream is None:
            return self._refuse(writer, "connect_failed")
        task = asyncio.current_task()
        assert task is not None
        if self._tenants.get(peer) is not tenant or not matches(name, tenant.domains):
            upstream[1].transport.abort()  # an update took it away meanwhile
            return self._refuse(writer, "not_allowed")
        tenant.conns[task] = name
        CONNECTIONS.labels("relayed").inc()
        up_r, up_w = upstream
        _nodelay(writer)
        try:
            up_w.write(head)
            await _relay(reader, writer, up_r, up_w)
        except asyncio.CancelledError:
            writer.transport.abort()  # the policy closed it: the guest sees a reset
            up_w.transport.abort()
        except OSError:
            writer.transport.abort()
            up_w.transport.abort()
        finally:
            tenant.conns.pop(task, None)
            for w in (writer, up_w):
                w.close()

    @staticmethod
    async def _first_bytes(reader: asyncio.StreamReader, port: int) -> tuple[bytes, str | None]:
        parse, limit = (tls_sni, MAX_HELLO) if port == 443 else (http_host, MAX_HEAD)
        head = b""
        while True:
            chunk = await reader.read(4096)
            if not chunk:
                return head, None
            head += chunk
            try:
                return head, parse(head)
            except NeedMore:
                if len(head) >= limit:
                    return head, None

    @staticmethod
    async def _resolve(tenant: _Tenant, name: str) -> list[ipaddress.IPv4Address]:
        try:
            answer = await tenant.resolver.resolve(name, "A")
        except (dns.exception.DNSException, OSError):
            return []
        return [ipaddress.IPv4Address(r.address) for r in answer]

    @staticmethod
    async def _connect(addrs: list[ipaddress.IPv4Address], port: int
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:  # fmt: skip
        for a in addrs:
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection(str(a), port),
                                              CONNECT_TIMEOUT_S)  # fmt: skip
            except (OSError, TimeoutError):
                continue
            _nodelay(w)
            return r, w
        return None

    @staticmethod
    def _refuse(writer: asyncio.StreamWriter, outcome: str) -> None:
        CONNECTIONS.labels(outcome).inc()
        writer.transport.abort()  # RST, not FIN: the guest must not take it for an answer


def _nodelay(w: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _relay(a_r: asyncio.StreamReader, a_w: asyncio.StreamWriter,
                 b_r: asyncio.StreamReader, b_w: asyncio.StreamWriter) -> None:  # fmt: skip
    """Both directions until both ended; the first error ends the other too."""
    tasks = {asyncio.ensure_future(_pipe(a_r, b_w)), asyncio.ensure_future(_pipe(b_r, a_w))}
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            t.result()  # raises the first error
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy until EOF, then pass the half-close on."""
    while data := await src.read(CHUNK):
        dst.write(data)
        await dst.drain()
    if dst.can_write_eof():
        with contextlib.suppress(OSError):
            dst.write_eof()
