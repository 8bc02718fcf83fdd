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

The hairpin: on a node that serves sandbox URLs on a domain (`AENV_DOMAIN`), TCP 80/443 to
the host's own addresses comes here too, and a name `<port>-<sandboxID>.<domain>` goes to
the node's own listener (on the scheme it serves: 443 for TLS, 80 for HTTP), where the
target's rules apply as for any client. A sandbox may use it if it may reach public
destinations, or if a domain entry of its policy matches the name.

Refused connections are reset: the guest sees its connect succeed and then ECONNRESET,
as E2B documents for its own blocked connections. A live update that takes a name away
resets the open connections to it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import ssl
from collections.abc import Coroutine
from dataclasses import dataclass, field

from prometheus_client import Counter

from aenv.config import Config
from aenv.network.domains import matches
from aenv.network.egress import EgressPolicy, EgressSets
from aenv.network.intercept import Interceptor, serve_intercepted
from aenv.network.relay import accept, relay_tunnel, reset
from aenv.network.rules import PROXIED_PORTS
from aenv.network.transforms import Rule, rule_for
from aenv.network.upstream import FIRST_BYTES_TIMEOUT_S, Upstream, connect, first_bytes

log = logging.getLogger(__name__)

CONNECTIONS = Counter("aenv_egress_proxy_connections_total",
                      "Guest connections through the egress proxy by outcome", ["outcome"])


@dataclass(frozen=True)
class Hairpin:
    """The node's own sandbox URLs, `<port>-<sandboxID>.<domain>`: a guest connection for one
    goes to the node's listener (`addr`:`port`, TLS or not), whose data plane applies the
    target's own rules (tokens), as for a request from anywhere else."""

    domain: str
    addr: str
    port: int
    tls: bool

    def serves(self, name: str) -> bool:
        head, dot, rest = name.partition(".")
        return bool(dot) and rest == self.domain and _SANDBOX_HOST.fullmatch(head) is not None


_SANDBOX_HOST = re.compile(r"\d{1,5}-[a-z0-9]+")


def hairpin_of(cfg: Config) -> Hairpin | None:
    """The node's sandbox URLs, if it serves them on a domain (`AENV_DOMAIN`)."""
    if not cfg.domain:
        return None
    wildcard = cfg.host in ("", "0.0.0.0", "::")
    addr = "127.0.0.1" if wildcard else socket.gethostbyname(cfg.host)
    return Hairpin(cfg.domain.lower().rstrip("."), addr, cfg.port,
                   tls=cfg.tls_cert_file is not None)


@dataclass
class _Tenant:
    domains: tuple[str, ...]
    internet: bool  # public destinations are open to it, so are the node's sandbox URLs
    sets: EgressSets
    up: Upstream
    rules: tuple[Rule, ...]
    conns: dict[asyncio.Task[None], str] = field(default_factory=dict)  # open, by name


def _is_own_peer(local: str, peer: str) -> bool:
    """The peer is the slot end of the /30 whose host end it connected to."""
    try:
        return ipaddress.IPv4Address(local) + 1 == ipaddress.IPv4Address(peer)
    except ValueError:
        return False


class EgressProxy:
    def __init__(self, host: str = "0.0.0.0", hairpin: Hairpin | None = None,
                 interceptor: Interceptor | None = None) -> None:  # fmt: skip
        # Bound on every host address, yet it serves only slots it was told of (admit).
        self._host = host
        self.hairpin = hairpin
        self.interceptor = interceptor  # rules for the node's sandbox URLs (the hairpin)
        # The hairpin's upstream is the node's own listener: its certificate is not checked.
        self._own_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self._own_tls.check_hostname = False
        self._own_tls.verify_mode = ssl.CERT_NONE
        self._listeners: list[socket.socket] = []
        self._tasks: set[asyncio.Task[None]] = set()  # accept loops and connections
        self._tenants: dict[str, _Tenant] = {}

    @property
    def ports(self) -> tuple[int, ...]:
        """The listening port for each guest port of rules.PROXIED_PORTS; () until started."""
        return tuple(s.getsockname()[1] for s in self._listeners)

    async def start(self) -> None:
        for guest_port in PROXIED_PORTS:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._host, 0))
            sock.listen(1024)
            self._listeners.append(sock)
            self._spawn(self._accept(sock, guest_port))

    async def close(self) -> None:
        for t in list(self._tenants):
            self.forget(t)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sock in self._listeners:
            sock.close()
        self._listeners.clear()

    def admit(self, slot_addr: str, policy: EgressPolicy, sets: EgressSets | None) -> None:
        """The policy now on the slot at `slot_addr`: its domains are served from now on,
        and its open connections to names no longer allowed are reset."""
        if sets is None or not sets.proxied:
            self.forget(slot_addr)
            return
        old = self._tenants.get(slot_addr)
        t = _Tenant(policy.domains, policy.internet, sets, Upstream.of(policy, sets),
                    policy.rules)  # fmt: skip
        if old is not None:
            same_way = t.up.same_way(old.up) and t.rules == old.rules
            for task, name in old.conns.items():
                if self._allows(t, name) and (same_way or self._pinned(name)):
                    t.conns[task] = name
                else:
                    task.cancel()
        self._tenants[slot_addr] = t

    def _pinned(self, name: str) -> bool:
        return self.hairpin is not None and self.hairpin.serves(name)

    def _allows(self, t: _Tenant, name: str) -> bool:
        if self._pinned(name):
            return bool(t.sets.hairpin) and (t.internet or matches(name, t.domains))
        return matches(name, t.domains)

    def forget(self, slot_addr: str) -> None:
        """The slot was released or closed: reset what it has open."""
        t = self._tenants.pop(slot_addr, None)
        if t is not None:
            for task in t.conns:
                task.cancel()

    def _spawn(self, work: Coroutine[object, object, None]) -> None:
        t = asyncio.get_running_loop().create_task(work)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _accept(self, listener: socket.socket, port: int) -> None:
        while True:
            conn, peer = await accept(listener, "egress proxy")
            self._spawn(self._serve(conn, peer, port))

    # --- one connection ------------------------------------------------------------------

    async def _serve(self, conn: socket.socket, peer: str, port: int) -> None:
        relayed = False
        try:
            relayed = await self._relay_if_allowed(conn, peer, port)
        finally:
            if not relayed:
                reset(conn)

    async def _relay_if_allowed(self, conn: socket.socket, peer: str, port: int) -> bool:
        """Judge the connection and relay it if allowed (True: it was, and is closed now)."""
        local = conn.getsockname()[0]
        tenant = self._tenants.get(peer) if _is_own_peer(local, peer) else None
        if tenant is None:
            return _refused("no_tenant")
        try:
            # With rules, peeked rather than read: an intercepted name's TLS is ended here,
            # from its ClientHello. Without, read and replayed (a peek costs a wake more).
            peek = bool(tenant.rules) and self.interceptor is not None
            head, name = await asyncio.wait_for(first_bytes(conn, port, peek=peek),
                                                FIRST_BYTES_TIMEOUT_S)  # fmt: skip
        except (TimeoutError, OSError):
            return _refused("no_name")
        if name is None or not self._allows(tenant, name):
            log.debug("egress proxy: %s refused %s:%d", peer, name, port)
            return _refused("not_allowed")
        if self.hairpin is not None and self._pinned(name):
            if self.hairpin.tls != (port == 443):  # the node speaks one scheme only
                return _refused("hairpin_scheme")
            up = await connect([ipaddress.IPv4Address(self.hairpin.addr)], self.hairpin.port)
            outcome = "hairpin"
        else:
            up, outcome = await tenant.up.to_name(name, port)
        if up is None:
            return _refused("connect_failed" if outcome in ("relayed", "tunnelled") else outcome)
        task = asyncio.current_task()
        assert task is not None
        if self._tenants.get(peer) is not tenant or not self._allows(tenant, name):
            up.close(rst=True)  # an update took it away meanwhile
            return _refused("not_allowed")
        tenant.conns[task] = name
        rule = rule_for(tenant.rules, name) if self.interceptor is not None else None
        CONNECTIONS.labels("intercepted" if rule is not None else outcome).inc()
        try:
            if rule is not None and self.interceptor is not None:
                await serve_intercepted(conn, up, name, port == 443, rule, self.interceptor,
                                        self._own_tls if outcome == "hairpin" else None)
            else:
                await relay_tunnel(conn, up, b"" if peek else head)
        finally:
            # An update may have moved it to the tenant that replaced this one.
            for t in (tenant, self._tenants.get(peer)):
                if t is not None:
                    t.conns.pop(task, None)
        return True


def _refused(outcome: str) -> bool:
    CONNECTIONS.labels(outcome).inc()
    return False
