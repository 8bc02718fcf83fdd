"""Network isolation seen from real guests: TCP, UDP and ICMP probes from inside sandboxes.

Three sandboxes of one runtime (its own instance, slot network 198.18.0.0/16):
- `closed`: the default, no egress;
- `named`: `allowOut` = exactly one address, an "internet" server in a namespace of the test
  (198.19.x, outside the slot network), with `denyOut: 0.0.0.0/0` (E2B's allow-list idiom);
- `wide`: `allow_internet_access` and `allowOut: 0.0.0.0/0`.
Each probes the host (every address it has, a stand-in API port), its own and the others'
slots, the metadata address, private and shared ranges and the internet server, and sends
spoofed raw frames (to the host's 127.0.0.1, or with the slot's address as source). Only
`named` may reach the internet server; UDP is checked where it would land (listeners on the
host, in the other slots and in the internet namespace).

The route out is the operator's (docs/security.md, "Egress"): here forwarding is switched
on for just the interfaces involved, and a routing rule for traffic from the slots allows
only our namespaces and makes everything else unreachable, so no probe can leave the
machine whatever the slot rules do.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import random
import secrets
import socket
import subprocess
import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pyroute2 import IPRoute

from aenv import config as config_mod
from aenv.machines.api import AGENT_PORT, AgentInit, SandboxHandle
from aenv.machines.runtime import Runtime
from aenv.network import GATEWAY_ADDR, TAP_MAC, EgressPolicy
from aenv.network import netns as ns
from aenv.network.egress import host_local_networks
from aenv.network.slot import Slot
from tests.support import envd_client
from tests.support.internet import (
    Internet,
    TcpSink,
    UdpSink,
    forwarding,
    free_port,
    internet_namespace,
)

pytestmark = pytest.mark.vm

SLOT_NETWORK = "198.18.0.0/16"
PROBE_TIMEOUT = 3.0  # per probe, all in parallel inside the guest
OFF_MACHINE = ["169.254.169.254", "10.0.0.1", "172.16.0.1", "192.168.0.1", "100.64.0.1"]

# Runs in the guest as root: every probe in its own thread; prints one JSON object.
PROBE = textwrap.dedent(r"""
    import errno, json, os, socket, struct, sys, threading, time
    spec = json.loads(sys.argv[1])
    T, marker = spec["timeout"], spec["marker"].encode()
    out = {}

    def tcp(addr, port):
        s = socket.socket(); s.settimeout(T)
        try:
            s.connect((addr, port)); return "connected"
        except socket.timeout:
            return "timeout"
        except OSError as e:
            return errno.errorcode.get(e.errno, str(e.errno))
        finally:
            s.close()

    def csum(b):
        b += b"\0" * (len(b) % 2)
        s = sum(struct.unpack(f"!{len(b) // 2}H", b))
        s = (s >> 16) + (s & 0xFFFF); s += s >> 16
        return ~s & 0xFFFF

    def icmp(addr):
        ident = (os.getpid() ^ threading.get_ident()) & 0xFFFF
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        s.settimeout(0.2)
        hdr = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + marker
        s.sendto(struct.pack("!BBHHH", 8, 0, csum(hdr), ident, 1) + marker, (addr, 0))
        end = time.monotonic() + T
        try:
            while time.monotonic() < end:
                try:
                    data, src = s.recvfrom(2048)
                except socket.timeout:
                    continue
                ihl = (data[0] & 15) * 4
                typ, _, _, rid = struct.unpack("!BBHH", data[ihl:ihl + 6])
                if typ == 0 and rid == ident and src[0] == addr:
                    return "reply"
            return "timeout"
        finally:
            s.close()

    def udp(addr, port):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _ in range(3):
                try:
                    s.sendto(marker + b" udp", (addr, port))
                except OSError as e:
                    return errno.errorcode.get(e.errno, str(e.errno))
        return "sent"

    def raw(src, dst, port):
        # A hand-made frame to the gateway's MAC: addresses the guest's own stack refuses.
        payload = marker + b" raw"
        udph = struct.pack("!HHHH", 40000, port, 8 + len(payload), 0) + payload
        iph = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udph), 1, 0, 64, 17, 0,
                          socket.inet_aton(src), socket.inet_aton(dst))
        iph = iph[:10] + struct.pack("!H", csum(iph)) + iph[12:]
        mac = lambda m: bytes.fromhex(m.replace(":", ""))
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
            s.bind(("eth0", 0))
            frame = mac(spec["gw_mac"]) + mac(spec["mac"]) + b"\x08\x00" + iph + udph
            for _ in range(3):
                s.send(frame)
        return "sent"

    jobs = []
    for t in spec["targets"]:
        a = t["addr"]
        jobs.append((f"tcp {a}:{t['tcp']}", tcp, (a, t["tcp"])))
        jobs.append((f"udp {a}:{t['udp']}", udp, (a, t["udp"])))
        jobs.append((f"icmp {a}", icmp, (a,)))
    for r in spec["raw"]:
        jobs.append((f"raw {r[0]}>{r[1]}", raw, tuple(r)))

    def run(name, fn, args):
        try:
            out[name] = fn(*args)
        except Exception as e:
            out[name] = f"error {e!r}"
    threads = [threading.Thread(target=run, args=j) for j in jobs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    print(json.dumps(out))
""")


@dataclass
class RouteGuard:
    """What arrives from the slots may go to the test's namespaces only: a routing rule per
    slot veth into a table holding their routes and `unreachable` for everything else
    (the host's own addresses are delivered by the local table first, as always)."""

    table: int
    priority: int
    slots: list[Slot] = field(default_factory=list)

    def install(self, inet: Internet) -> None:
        with IPRoute() as ipr:
            ipr.route("add", dst=str(inet.net), oif=socket.if_nametoindex(inet.host_if),
                      table=self.table)
            for s in self.slots:
                net = ipaddress.ip_network(f"{s.host_addr}/30", strict=False)
                ipr.route("add", dst=str(net), oif=socket.if_nametoindex(s.host_veth),
                          table=self.table)
                ipr.rule("add", iifname=s.host_veth, table=self.table, priority=self.priority)
                forwarding(s.host_veth, True)
            ipr.route("add", dst="0.0.0.0/0", type="unreachable", table=self.table)

    def remove(self) -> None:
        with IPRoute() as ipr:
            for s in self.slots:
                with contextlib.suppress(Exception):
                    ipr.rule("del", iifname=s.host_veth, table=self.table,
                             priority=self.priority)
                with contextlib.suppress(OSError):
                    forwarding(s.host_veth, False)
            with contextlib.suppress(Exception):
                ipr.flush_routes(table=self.table)


@pytest.fixture(scope="module")
async def rt() -> AsyncIterator[Runtime]:
    if os.geteuid() != 0:
        pytest.skip("VM tests need root")
    instance = "i" + secrets.token_hex(3)
    # Its own slot network (so 198.19.x is not "another sandbox") and uid range; one warm
    # VM, so both the pooled and the fresh start path get a policy.
    cfg = config_mod.load(instance=instance, slot_network=SLOT_NETWORK, warm_pool_size=1,
                          primed_pool_size=0,
                          jail_uid_base=886000 + 256 * random.randrange(8))
    runtime = Runtime(cfg)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.close()
        cfg.sandboxes_dir.rmdir()  # empty, or something was left behind
    assert ns.list_netns(f"{instance}-") == [], "slots left behind"


@pytest.fixture
def internet() -> Iterator[Internet]:
    with internet_namespace() as inet:
        yield inet


async def _probe(h: SandboxHandle, spec: dict) -> dict[str, str]:
    cmd = f"cat > /tmp/probe.py <<'E'\n{PROBE}\nE\npython3 /tmp/probe.py '{json.dumps(spec)}'"
    code, out, err = await asyncio.to_thread(envd_client.run, h.url(), cmd, None, 120.0,
                                             "root")
    assert code == 0, err
    return json.loads(out.splitlines()[-1])


def _denied(slot: Slot) -> int:
    def read() -> int:
        out = subprocess.run(["nft", "list", "counter", "inet", "aenv", "guest_denied"],
                             capture_output=True, text=True, check=True).stdout
        return int(out.split("packets ")[1].split()[0])

    return ns.run_in_netns(slot.netns_path, read)


async def test_guests_reach_only_what_their_policy_names(rt: Runtime, internet: Internet):
    inet = internet
    sid = "t" + secrets.token_hex(5)
    policies = {
        "closed": EgressPolicy(),
        "named": EgressPolicy.from_request(None, [inet.addr], ["0.0.0.0/0"]),
        "wide": EgressPolicy.from_request(True, ["0.0.0.0/0"]),
    }
    handles: dict[str, SandboxHandle] = {}
    guard = RouteGuard(table=0x7A00 + random.randrange(256), priority=900)
    sinks: list[UdpSink] = []
    api = None
    try:
        for name, policy in policies.items():
            handles[name] = await rt.create(f"{sid}{name}", "base",
                                            AgentInit(default_user="root", egress=policy))
        slots = {n: rt.machines()[h.sandbox_id].slot for n, h in handles.items()}
        guard.slots = list(slots.values())
        await asyncio.to_thread(guard.install, inet)  # pyroute2 may not run on the loop

        # Listeners wherever a probe could land: the host (every address: the stand-in API
        # port and a UDP port), each slot's namespace, the internet (set up above).
        api = TcpSink(free_port())
        host_udp = UdpSink(inet.udp_port, inet.marker)
        sinks.append(host_udp)
        slot_udp = {n: ns.run_in_netns(s.netns_path, UdpSink, inet.udp_port, inet.marker)
                    for n, s in slots.items()}
        sinks += slot_udp.values()

        host_addrs = sorted({str(n.network_address)
                             for n in await asyncio.to_thread(host_local_networks)
                             if n.prefixlen == 32})
        assert {"127.0.0.1", inet.host_addr, inet.host_public} <= set(host_addrs)
        # 127.x in the guest is the guest's own loopback: the host's is tried by a raw frame.
        targets = [{"addr": a, "tcp": api.sock.getsockname()[1], "udp": inet.udp_port}
                   for a in host_addrs if not a.startswith("127.")]
        for s in slots.values():  # each slot: the agent port behind it, and the slot itself
            targets.append({"addr": s.slot_addr, "tcp": AGENT_PORT, "udp": inet.udp_port})
        targets += [{"addr": a, "tcp": 80, "udp": inet.udp_port}
                    for a in (GATEWAY_ADDR, *OFF_MACHINE)]
        targets.append({"addr": inet.addr, "tcp": inet.tcp_port, "udp": inet.udp_port})

        before = {n: _denied(s) for n, s in slots.items()}
        specs = {n: {"timeout": PROBE_TIMEOUT, "marker": inet.marker.decode(),
                     "targets": targets, "mac": "06:00:a9:fe:00:15", "gw_mac": TAP_MAC,
                     "raw": [["169.254.0.21", "127.0.0.1", inet.udp_port],
                             [slots[n].slot_addr, slots[n].host_addr, inet.udp_port],
                             ["169.254.0.21", inet.host_addr, inet.udp_port]]}
                 for n in handles}
        results = dict(zip(handles, await asyncio.gather(
            *(_probe(handles[n], specs[n]) for n in handles)), strict=True))

        inet_keys = {f"tcp {inet.addr}:{inet.tcp_port}", f"icmp {inet.addr}"}
        for name, res in results.items():
            reached = {k: v for k, v in res.items()
                       if v in ("connected", "reply") or v.startswith("error")}
            want = inet_keys if name == "named" else set()
            assert set(reached) == want, (name, reached)
            if name != "closed":
                # Routed (a default route exists), so the slot's rules did the dropping:
                # silence, not an unreachable from the guard behind them.
                silent = {k: v for k, v in res.items() if k.startswith(("tcp", "icmp"))
                          and k not in want and v != "timeout"}
                assert silent == {}, (name, silent)
                assert _denied(slots[name]) > before[name]
        assert inet.tcp.peers == [slots["named"].slot_addr]  # SNAT: the slot's address
        assert set(inet.udp.received()) == {slots["named"].slot_addr}
        assert host_udp.received() == []
        assert {n: u.received() for n, u in slot_udp.items()} == {n: [] for n in slot_udp}
        assert api.peers == []
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0"
    finally:
        for sink in sinks:
            sink.close()
        if api is not None:
            api.close()
        await asyncio.to_thread(guard.remove)
        for h in handles.values():
            await rt.kill(h)


async def test_a_released_slot_is_closed_again(rt: Runtime, internet: Internet):
    """The next tenant of a slot starts with no egress and no route out."""
    sid = "t" + secrets.token_hex(5)
    h = await rt.create(sid, "base", AgentInit(
        egress=EgressPolicy.from_request(True, [internet.addr])))
    slot = rt.machines()[sid].slot

    def state() -> tuple[str, str]:
        sets = subprocess.run(["nft", "list", "set", "inet", "aenv", "allow_special"],
                              capture_output=True, text=True, check=True).stdout
        routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True,
                                check=True).stdout
        return sets, routes

    sets, routes = ns.run_in_netns(slot.netns_path, state)
    assert internet.addr in sets and f"default via {slot.host_addr}" in routes
    await rt.kill(h)
    assert rt.slots.idle >= 1  # kept for reuse ...
    sets, routes = ns.run_in_netns(slot.netns_path, state)
    assert internet.addr not in sets and "default" not in routes  # ... and closed again
