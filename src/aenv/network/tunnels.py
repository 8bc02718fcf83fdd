"""The slots' own listeners: a sandbox's TCP through its `egressProxy` (socks.py), and its
HTTP/HTTPS to `network.rules` domains, rewritten (intercept.py).

While a slot's policy has an egressProxy or rules, the slot holds one listener of the
node's, made inside the slot's namespace. The slot's rules (rules.py) redirect to it:
- with rules, every guest TCP connection to port 80 or 443 (`intercept_map`), except to
  the never ranges;
- with an egressProxy, every other TCP connection the allow/deny order accepts
  (`socks_map`), DNS excepted.
The connection's conntrack entry, in the same namespace, still holds the guest's
destination (SO_ORIGINAL_DST).

On 80 and 443 with rules, the first bytes name the destination (SNI, Host; read without
consuming them). It must be allowed as it would be without rules: by the order (the guest's
own address) or by a domain of allowOut (the name, resolved by the node); else reset. A
name with a rule is intercepted; any other goes on unchanged, like every connection of the
egressProxy path. Onward connections go through the egressProxy if there is one
(upstream.py).

- Fail closed: a proxy that cannot be reached, refuses, or fails TLS gets the guest a reset,
  never a direct connection.
- A live update re-judges open connections. Those whose destination (address or name) the
  new policy refuses, or whose way out (proxy, DNS) or rules it changes, are reset. Without
  a proxy and rules the listener closes.
- Releasing the slot closes its listener and resets its connections.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import Counter

from aenv.network import netns as ns
from aenv.network.addressing import GATEWAY_ADDR
from aenv.network.domains import matches
from aenv.network.egress import EgressPolicy, EgressSets, accepted_by_address
from aenv.network.intercept import Interceptor, serve_intercepted
from aenv.network.relay import accept, relay_tunnel, reset
from aenv.network.rules import PROXIED_PORTS
from aenv.network.transforms import rule_for
from aenv.network.upstream import FIRST_BYTES_TIMEOUT_S, Upstream, first_bytes

log = logging.getLogger(__name__)

TUNNELS = Counter("aenv_egress_tunnels_total",
                  "Guest connections through a slot's listener (egressProxy, rules) by outcome",
                  ["outcome"])  # fmt: skip
_SO_ORIGINAL_DST = 80


@dataclass(frozen=True)
class _Conn:
    dst: ipaddress.IPv4Address
    name: str | None  # allowed by this name (a domain), else by its address
    intercepted: bool


@dataclass
class _Slot:
    listener: socket.socket
    accept: asyncio.Task[None]
    policy: EgressPolicy | None = None
    sets: EgressSets | None = None
    up: Upstream | None = None
    conns: dict[asyncio.Task[None], _Conn] = field(default_factory=dict)


def _listen_inside() -> socket.socket:
    # Made in the slot's namespace (run_in_netns): it stays there, whoever accepts.
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
    s.bind((GATEWAY_ADDR, 0))
    s.listen(1024)
    return s


def _original_dst(conn: socket.socket) -> tuple[ipaddress.IPv4Address, int]:
    raw = conn.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
    port, addr = struct.unpack_from("!2xH4s", raw)
    return ipaddress.IPv4Address(addr), port


def needs_listener(policy: EgressPolicy) -> bool:
    return not policy.is_closed and (policy.egress_proxy is not None or bool(policy.rules))


class SlotListeners:
    def __init__(self, interceptor: Interceptor | None = None) -> None:
        self._slots: dict[str, _Slot] = {}  # by slot address
        self.interceptor = interceptor

    async def listen(self, slot_addr: str, netns_path: str | Path) -> int:
        """The port of the slot's listener, made now if it has none."""
        s = self._slots.get(slot_addr)
        if s is None:
            sock = await asyncio.to_thread(ns.run_in_netns, netns_path, _listen_inside)
            task = asyncio.get_running_loop().create_task(self._accept(slot_addr, sock))
            s = self._slots[slot_addr] = _Slot(sock, task)
        port: int = s.listener.getsockname()[1]
        return port

    def admit(self, slot_addr: str, policy: EgressPolicy, sets: EgressSets | None) -> None:
        """The policy now on the slot: its connections follow it (see the docstring)."""
        s = self._slots.get(slot_addr)
        if s is None:
            return
        if sets is None or not needs_listener(policy):
            self.forget(slot_addr)
            return
        old_policy, old_up = s.policy, s.up
        s.policy, s.sets, s.up = policy, sets, Upstream.of(policy, sets)
        same = (old_up is not None and s.up.same_way(old_up) and old_policy is not None
                and old_policy.rules == policy.rules)  # fmt: skip
        for task, c in list(s.conns.items()):
            if not same or not self._allowed(s, c.dst, c.name):
                task.cancel()

    def forget(self, slot_addr: str) -> None:
        s = self._slots.pop(slot_addr, None)
        if s is None:
            return
        s.accept.cancel()
        s.listener.close()
        for task in s.conns:
            task.cancel()

    async def close(self) -> None:
        tasks = [t for s in self._slots.values() for t in (s.accept, *s.conns)]
        for a in list(self._slots):
            self.forget(a)
        await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    def _allowed(s: _Slot, dst: ipaddress.IPv4Address, name: str | None) -> bool:
        if s.policy is None or s.sets is None:
            return False
        if name is not None:
            return matches(name, s.policy.domains)
        return accepted_by_address(dst, s.sets)

    async def _accept(self, slot_addr: str, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await accept(listener, "slot listener")
            s = self._slots.get(slot_addr)
            if s is None or s.listener is not listener:
                reset(conn)
                return
            task = loop.create_task(self._serve(slot_addr, s, conn))
            task.add_done_callback(lambda t, s=s: s.conns.pop(t, None))

    async def _serve(self, slot_addr: str, s: _Slot, conn: socket.socket) -> None:
        task = asyncio.current_task()
        assert task is not None
        served = False
        try:
            served = await self._judge_and_serve(slot_addr, s, conn, task)
        finally:
            if not served:
                reset(conn)

    async def _judge_and_serve(self, slot_addr: str, s: _Slot, conn: socket.socket,
                               task: asyncio.Task[None]) -> bool:  # fmt: skip
        if self._slots.get(slot_addr) is not s or s.policy is None or s.up is None:
            return _count("not_allowed")  # released, or not admitted yet
        try:
            dst, port = _original_dst(conn)
        except OSError:
            return _count("no_destination")
        policy, up = s.policy, s.up
        rule, name = None, None
        if policy.rules and port in PROXIED_PORTS:
            try:
                _, name = await asyncio.wait_for(first_bytes(conn, port, peek=True),
                                                 FIRST_BYTES_TIMEOUT_S)  # fmt: skip
            except (TimeoutError, OSError):
                return _count("no_name")
            rule = rule_for(policy.rules, name) if name else None
        by_order = self._allowed(s, dst, None)
        if not by_order and not (name is not None and self._allowed(s, dst, name)):
            return _count("not_allowed")
        c = _Conn(dst, None if by_order else name, rule is not None)
        s.conns[task] = c
        if c.name is not None:
            tun, outcome = await up.to_name(c.name, port)
        else:
            tun, outcome = await up.to_address(dst, port), "relayed"
        if tun is None:
            return _count("proxy_failed" if up.proxy is not None else "connect_failed")
        if s.conns.get(task) is None:  # an update reset it meanwhile
            tun.close(rst=True)
            return _count("not_allowed")
        if rule is None or name is None or self.interceptor is None:
            _count("tunnelled" if up.proxy is not None else outcome)
            await relay_tunnel(conn, tun)
            return True
        _count("intercepted")
        await serve_intercepted(conn, tun, name, port == 443, rule, self.interceptor)
        return True  # closed, one way or the other


def _count(outcome: str) -> bool:
    TUNNELS.labels(outcome).inc()
    return False
