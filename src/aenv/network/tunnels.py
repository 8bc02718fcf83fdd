"""SOCKS tunnels: a sandbox's TCP egress through its `egressProxy` (socks.py).

While a slot's policy has an egressProxy, the slot holds one listener of the node's, made
inside the slot's namespace. The slot's rules (`socks_pick` in rules.py) redirect to it
every TCP connection of the guest that the allow/deny order accepts (DNS excepted). The
connection's conntrack entry, in the same namespace, still holds the guest's destination
(SO_ORIGINAL_DST). The node dials that address and port through the proxy and relays.

- Fail closed: a proxy that cannot be reached, refuses, or fails TLS gets the guest a reset,
  never a direct connection.
- A live update re-judges open tunnels. Those whose destination the new order refuses, or
  whose proxy the update changed or removed, are reset. Without a proxy the listener
  closes, and new connections go out directly, as the order says.
- Releasing the slot closes its listener and resets its tunnels.
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
from aenv.network.egress import EgressPolicy, EgressSets, accepted_by_address
from aenv.network.relay import relay_tunnel, reset
from aenv.network.socks import SocksConfigError, SocksProxy, dial, resolve

log = logging.getLogger(__name__)

TUNNELS = Counter("aenv_egress_tunnels_total",
                  "Guest connections through an egressProxy by outcome", ["outcome"])
_SO_ORIGINAL_DST = 80


@dataclass
class _Slot:
    listener: socket.socket
    accept: asyncio.Task[None]
    proxy: SocksProxy | None = None
    sets: EgressSets | None = None
    conns: dict[asyncio.Task[None], tuple[ipaddress.IPv4Address, SocksProxy]] = field(
        default_factory=dict)


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


class SocksTunnels:
    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}  # by slot address

    async def listen(self, slot_addr: str, netns_path: str | Path) -> int:
        """The port of the slot's tunnel listener, made now if it has none."""
        s = self._slots.get(slot_addr)
        if s is None:
            sock = await asyncio.to_thread(ns.run_in_netns, netns_path, _listen_inside)
            task = asyncio.get_running_loop().create_task(self._accept(slot_addr, sock))
            s = self._slots[slot_addr] = _Slot(sock, task)
        port: int = s.listener.getsockname()[1]
        return port

    def admit(self, slot_addr: str, policy: EgressPolicy, sets: EgressSets | None) -> None:
        """The policy now on the slot: its tunnels follow it (see the module docstring)."""
        s = self._slots.get(slot_addr)
        if s is None:
            return
        if sets is None or policy.egress_proxy is None:
            self.forget(slot_addr)
            return
        s.proxy, s.sets = policy.egress_proxy, sets
        for task, (dst, proxy) in list(s.conns.items()):
            if proxy != s.proxy or not accepted_by_address(dst, sets):
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

    async def _accept(self, slot_addr: str, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as e:  # EMFILE and the like: the listener itself stays
                log.warning("egress tunnels: accept: %s", e)
                await asyncio.sleep(0.1)
                continue
            s = self._slots.get(slot_addr)
            if s is None or s.listener is not listener:
                reset(conn)
                return
            task = loop.create_task(self._serve(slot_addr, s, conn))
            task.add_done_callback(lambda t, s=s: s.conns.pop(t, None))

    async def _serve(self, slot_addr: str, s: _Slot, conn: socket.socket) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._slots.get(slot_addr) is not s:  # released before this task started
            reset(conn)
            return None
        try:
            dst, port = _original_dst(conn)
        except OSError:
            reset(conn)
            return _count("no_destination")
        proxy, sets = s.proxy, s.sets
        if proxy is None or sets is None or not accepted_by_address(dst, sets):
            reset(conn)  # the rules and the policy disagree for a moment: refuse
            return _count("not_allowed")
        s.conns[task] = (dst, proxy)
        try:
            addr = await resolve(proxy, (*sets.never, *sets.special))
            up = await dial(proxy, addr, str(dst), port)
        except (OSError, SocksConfigError) as e:
            log.info("egress tunnels: %s:%d through %s: %s", dst, port, proxy.address, e)
            reset(conn)  # fail closed
            return _count("proxy_failed")
        except asyncio.CancelledError:
            reset(conn)
            raise
        _count("tunnelled")
        await relay_tunnel(conn, up)


def _count(outcome: str) -> None:
    TUNNELS.labels(outcome).inc()
