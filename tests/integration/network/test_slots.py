"""Network slots end to end, without a VM.

The guest is emulated by what QEMU does with a tap: a userspace wire copies Ethernet frames
between the slot's real `tap0` and a tap `eth0` in a separate "guest" namespace configured
as the guest kernel's `ip=` argument would. So the production tap, MACs, addresses and
rules are all exercised; only the VMM is missing.

Needs root. Everything uses the prefix `aenvt-` and is removed even when a test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import http.client
import http.server
import os
import selectors
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pyroute2 import IPRoute
from pyroute2.netlink.nfnetlink.nfctsocket import NFCTSocket

from aenv.network import (
    GATEWAY_ADDR,
    GUEST_ADDR,
    GUEST_MAC,
    GUEST_PREFIXLEN,
    TAP_MAC,
    Slot,
    SlotNaming,
    SlotPool,
    SlotPoolError,
    create_slot,
    guest_ip_cmdline,
    list_owned,
    open_slot_tap,
    reclaim_orphans,
    slot_for,
)
from aenv.network import netns as ns
from aenv.network import slot as slot_module
from aenv.network.tap import open_tap
from tests.support.internet import HttpServer

PREFIX = "aenvt-"
# A corner of 198.18.0.0/15 of its own, so tests can run next to a node using the default.
NETWORK = "198.19.252.0/22"
UID_BASE = 881000
HTTP_PORT = 8080
DENY_TIMEOUT = 0.5

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/dev/net/tun").exists(),
    reason="needs root and /dev/net/tun",
)


# -- cleanup ------------------------------------------------------------------------------


def _our_links() -> list[str]:
    return [name for _, name in socket.if_nameindex() if name.startswith(PREFIX)]


def _cleanup_everything() -> None:
    reclaim_orphans(PREFIX)
    for name in ns.list_netns(PREFIX):  # fake guests and anything else with our prefix
        ns.delete_netns(name)
    with IPRoute() as ipr:
        for name in _our_links():
            for idx in ipr.link_lookup(ifname=name):
                ipr.link("del", index=idx)


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    _cleanup_everything()
    yield
    _cleanup_everything()
    assert ns.list_netns(PREFIX) == []
    assert _our_links() == []


@pytest.fixture
def pool() -> Iterator[SlotPool]:
    p = SlotPool(prefix=PREFIX, network=NETWORK, max_slots=16, uid_for_index=lambda i: UID_BASE + i)
    try:
        yield p
    finally:
        p.close()


# -- a guest without a VM -----------------------------------------------------------------


def _probe(addr: str, port: int, timeout: float) -> str:
    """Try a TCP connection from the calling thread's namespace."""
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return "connected"
    except TimeoutError:
        return "timeout"
    except ConnectionRefusedError:
        return "refused"
    except OSError as e:
        return f"error:{e.errno}"


class FakeGuest:
    """A guest NIC behind the slot's tap: does in userspace what the VMM does."""

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.name = f"{PREFIX}g{slot.index}"
        self.path = ns.create_netns(self.name)
        self._fds: list[int] = []
        self._threads: list[threading.Thread] = []
        self._server: HttpServer | None = None
        self._stop_r, self._stop_w = os.pipe()
        try:
            # Attach to the production tap like QEMU does (by name, inside the slot netns).
            self._fds.append(open_slot_tap(slot, vnet_hdr=False))
            self._fds.append(ns.run_in_netns(self.path, self._configure))
            relay = threading.Thread(target=self._relay, daemon=True)
            relay.start()
            self._threads.append(relay)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _configure() -> int:
        fd = open_tap("eth0")  # non-persistent: vanishes with the fd
        with IPRoute() as ipr:
            ipr.link("set", index=socket.if_nametoindex("lo"), state="up")
            eth0 = socket.if_nametoindex("eth0")
            ipr.link("set", index=eth0, address=GUEST_MAC, state="up")
            ipr.addr("add", index=eth0, address=GUEST_ADDR, prefixlen=GUEST_PREFIXLEN)
            ipr.route("add", dst="0.0.0.0/0", gateway=GATEWAY_ADDR)
        return fd

    def _relay(self) -> None:
        a, b = self._fds
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        sel.register(self._stop_r, selectors.EVENT_READ, None)
        with sel:
            while True:
                for key, _ in sel.select():
                    if key.data is None:
                        return
                    # A frame the other side will not take is lost, as on a real wire.
                    with contextlib.suppress(OSError):
                        os.write(key.data, os.read(key.fd, 65536))

    def serve_http(self, port: int = HTTP_PORT) -> None:
        name = self.name
        self._server = ns.run_in_netns(  # the socket lives in the guest netns
            self.path, lambda: HttpServer(port, lambda client: f"{name} {client}".encode(),
                                          addr=GUEST_ADDR))  # fmt: skip

    def probe(self, addr: str, port: int, timeout: float = DENY_TIMEOUT) -> str:
        return ns.run_in_netns(self.path, _probe, addr, port, timeout)

    def close(self) -> None:
        if self._stop_w < 0:
            return
        if self._server is not None:
            self._server.close()
        os.write(self._stop_w, b"x")
        for t in self._threads:
            t.join(timeout=5)
        for fd in (*self._fds, self._stop_r, self._stop_w):
            os.close(fd)
        self._fds.clear()
        self._stop_r = self._stop_w = -1
        ns.delete_netns(self.name)


@pytest.fixture
def guests() -> Iterator[list[FakeGuest]]:
    made: list[FakeGuest] = []
    try:
        yield made
    finally:
        for g in made:
            with contextlib.suppress(Exception):
                g.close()


def _get(slot: Slot, port: int = HTTP_PORT) -> str:
    conn = http.client.HTTPConnection(slot.slot_addr, port, timeout=3)
    try:
        conn.request("GET", "/")
        resp = conn.getresponse()
        assert resp.status == 200
        return resp.read().decode()
    finally:
        conn.close()


class _HostListener:
    """A TCP listener in the host namespace, to prove a probe did not get through."""

    def __init__(self, addr: str) -> None:
        self.sock = socket.socket()
        self.sock.bind((addr, 0))
        self.sock.listen(8)
        self.sock.settimeout(0)
        self.addr, self.port = self.sock.getsockname()

    def accepted_nothing(self) -> bool:
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            return True
        conn.close()
        return False

    def close(self) -> None:
        self.sock.close()


# -- tests --------------------------------------------------------------------------------


def test_constants_and_addressing() -> None:
    assert guest_ip_cmdline() == "ip=169.254.0.21::169.254.0.22:255.255.255.252::eth0:off"
    naming = SlotNaming(PREFIX)
    assert (naming.host_addr(0), naming.slot_addr(0)) == ("198.18.0.1", "198.18.0.2")
    assert (naming.host_addr(3), naming.slot_addr(3)) == ("198.18.0.13", "198.18.0.14")
    assert naming.slot_addr(naming.capacity - 1) == "198.19.255.254"
    assert naming.netns(7) == "aenvt-s7" and naming.host_veth(7) == "aenvt-7h"
    assert len(naming.host_veth(naming.capacity - 1)) <= 15
    with pytest.raises(ValueError):
        SlotNaming("much-too-long-")
    with pytest.raises(ValueError):
        naming.slot_addr(naming.capacity)


def test_slot_layout(pool: SlotPool) -> None:
    slot = pool.acquire()
    assert slot.netns == f"{PREFIX}s{slot.index}" and slot.netns_path.exists()
    assert slot.tap == "tap0" and slot.tap_uid == UID_BASE + slot.index
    assert slot.net_attachment().mac == GUEST_MAC

    out = subprocess.run(
        ["ip", "-d", "-n", slot.netns, "addr", "show", "tap0"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert TAP_MAC in out and f"{GATEWAY_ADDR}/30" in out
    assert f"user {slot.tap_uid} group {slot.tap_uid}" in out and "persist on" in out

    def inside() -> tuple[str, str]:
        return (
            Path("/proc/sys/net/ipv4/ip_forward").read_text().strip(),
            subprocess.run(["nft", "list", "table", "inet", "aenv"], capture_output=True,
                           text=True, check=True).stdout,
        )  # fmt: skip

    forward, rules = ns.run_in_netns(slot.netns_path, inside)
    assert forward == "1"
    assert f"dnat ip to {GUEST_ADDR}" in rules
    # Host-wide settings untouched.
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0"


def test_tap_attach_needs_its_uid(pool: SlotPool) -> None:
    slot = pool.acquire()
    # /dev/net/tun may be 0600 (it is here), so open it as root, then become the uid and
    # attach: the tap's owner check applies to the credentials at TUNSETIFF.
    script = textwrap.dedent(
        """
        import fcntl, os, struct, sys
        uid = int(sys.argv[1])
        fd = os.open("/dev/net/tun", os.O_RDWR)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # drops every capability
        try:
            fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH22x", b"tap0", 0x1002))
        except PermissionError:
            sys.exit(13)
        """
    )

    def attach_as(uid: int) -> int:
        cmd = ["nsenter", f"--net={slot.netns_path}", sys.executable, "-I", "-c", script,
               str(uid)]  # fmt: skip
        return subprocess.run(cmd, capture_output=True, timeout=30, check=False).returncode

    assert attach_as(slot.tap_uid) == 0  # an unprivileged VMM running as the slot uid
    assert attach_as(slot.tap_uid + 1000) == 13  # anybody else

    # The fd-passing path: root opens the tap for the VMM, with virtio-net headers.
    fd = open_slot_tap(slot)
    try:
        ifr = fcntl.ioctl(fd, 0x800454D2, bytes(40))  # TUNGETIFF
        name, flags = struct.unpack("16sH22x", ifr)
        assert name.rstrip(b"\0") == b"tap0" and flags & 0x4000  # IFF_VNET_HDR
    finally:
        os.close(fd)


def test_host_reaches_guests_which_share_one_address(
    pool: SlotPool, guests: list[FakeGuest]
) -> None:
    a, b = pool.acquire(), pool.acquire()
    assert a.index != b.index and a.slot_addr != b.slot_addr
    for slot in (a, b):
        guests.append(FakeGuest(slot))
        guests[-1].serve_http()
    # Same guest address behind both slots, each answering on its own; the guest sees the
    # connection come from its gateway, not from 198.18.x.
    assert _get(a) == f"{PREFIX}g{a.index} {GATEWAY_ADDR}"
    assert _get(b) == f"{PREFIX}g{b.index} {GATEWAY_ADDR}"
    # Any port maps to the same port in the guest: nothing listens on 8081.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((a.slot_addr, HTTP_PORT + 1), timeout=2).close()


def test_guest_cannot_start_connections(pool: SlotPool, guests: list[FakeGuest]) -> None:
    a, b = pool.acquire(), pool.acquire()
    guests.append(FakeGuest(a))
    guests.append(FakeGuest(b))
    ga, gb = guests
    gb.serve_http()
    assert _get(b).startswith(gb.name)  # b's guest is reachable from the host ...

    host_a = _HostListener(a.host_addr)
    host_b = _HostListener(b.host_addr)
    loopback = _HostListener("127.0.0.1")
    try:
        assert _probe(host_a.addr, host_a.port, 2) == "connected"  # the host itself can
        assert host_a.accepted_nothing() is False

        targets = [
            (a.host_addr, host_a.port),  # the host, through its own slot
            (a.slot_addr, HTTP_PORT),  # its own slot namespace
            (GATEWAY_ADDR, 22),  # the slot namespace by its gateway address
            (b.host_addr, host_b.port),  # the host through another slot
            (b.slot_addr, HTTP_PORT),  # ... another guest, which does answer the host
            (GUEST_ADDR, HTTP_PORT),  # itself: fine, but not someone else's
            ("169.254.169.254", 80),  # a metadata service
        ]
        results = {t: ga.probe(*t) for t in targets}
        assert results[(GUEST_ADDR, HTTP_PORT)] == "refused"  # its own, empty, port
        del results[(GUEST_ADDR, HTTP_PORT)]
        # Named, so that a failure says which (a dict's repr is cut short in the report).
        assert [t for t, r in results.items() if r == "connected"] == [], results
        # 127.0.0.1 in the guest is the guest's own loopback, never the host's listener.
        assert ga.probe("127.0.0.1", loopback.port) == "refused"
        assert host_a.accepted_nothing() and host_b.accepted_nothing()
        assert loopback.accepted_nothing()
    finally:
        for lst in (host_a, host_b, loopback):
            lst.close()

    # The deny rules did the blocking, not only missing routes: their counter moved.
    def denied() -> int:
        out = subprocess.run(["nft", "list", "counter", "inet", "aenv", "guest_denied"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        return int(out.split("packets ")[1].split()[0])

    assert ns.run_in_netns(a.netns_path, denied) >= 3
    assert ns.run_in_netns(b.netns_path, denied) == 0


def test_release_resets_and_reuses(pool: SlotPool, guests: list[FakeGuest]) -> None:
    slot = pool.acquire()
    guests.append(FakeGuest(slot))
    g = guests[-1]
    g.serve_http()
    assert _get(slot).startswith(g.name)
    g.close()  # the "VMM" is gone before the slot is released

    def conntrack_entries() -> int:
        with NFCTSocket() as ct:
            return len(list(ct.dump()))

    assert ns.run_in_netns(slot.netns_path, conntrack_entries) > 0
    pool.release(slot)
    assert pool.in_use == 0 and pool.idle == 1
    assert ns.run_in_netns(slot.netns_path, conntrack_entries) == 0

    again = pool.acquire()
    assert again == slot and pool.idle == 0
    guests.append(FakeGuest(again))
    guests[-1].serve_http()
    assert _get(again).startswith(guests[-1].name)

    with pytest.raises(ValueError):
        pool.release(slot_for(pool.naming, 9, 0))  # not ours

    # Released while its "VMM" still holds the tap: not reusable, so it is destroyed.
    busy = pool.acquire()
    fd = open_slot_tap(busy)
    try:
        pool.release(busy)
    finally:
        os.close(fd)
    assert pool.idle == 0 and busy.netns not in list_owned(PREFIX)


def test_close_leaves_nothing(pool: SlotPool) -> None:
    slots = [pool.acquire() for _ in range(3)]
    pool.release(slots[0])
    assert set(list_owned(PREFIX)) == {s.netns for s in slots}
    pool.close()
    pool.close()  # idempotent
    assert list_owned(PREFIX) == []
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert PREFIX not in out
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert PREFIX not in out
    with pytest.raises(RuntimeError):
        pool.acquire()


def test_failed_create_leaves_nothing(pool: SlotPool, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ruleset: str) -> None:
        raise RuntimeError("nft exploded")

    monkeypatch.setattr(slot_module, "apply_ruleset", broken)
    with pytest.raises(RuntimeError, match="nft exploded"):
        pool.acquire()
    assert ns.list_netns(PREFIX) == [] and _our_links() == []
    monkeypatch.undo()
    assert pool.acquire().index == 0  # the index was given back


def test_reclaim_orphans_and_skip_leftovers(pool: SlotPool) -> None:
    naming = SlotNaming(PREFIX, NETWORK)
    # A slot left behind by a crashed node, and a host veth whose namespace is gone.
    create_slot(slot_for(naming, 0, UID_BASE))
    with IPRoute() as ipr:
        ipr.link("add", ifname=naming.host_veth(5), kind="veth", peer=f"{PREFIX}5p")

    slot = pool.acquire()
    assert slot.index not in (0, 5)  # allocation steps around leftovers

    removed = reclaim_orphans(PREFIX, keep=pool.owned())
    assert set(removed) == {naming.netns(0), naming.host_veth(5)}
    assert list_owned(PREFIX) == [slot.netns]
    assert _our_links() == [slot.host_veth]  # the kept slot is intact


def test_adopt_claims_a_leftover_slot_as_it_is(pool: SlotPool) -> None:
    naming = SlotNaming(PREFIX, NETWORK)
    # What a node killed with -9 leaves: a slot whose tap a VMM that outlived it holds.
    left = slot_for(naming, 3, UID_BASE + 3)
    create_slot(left)
    fd = open_slot_tap(left)
    try:
        slot = pool.adopt(3)
        assert slot == left and pool.holds(slot) and pool.in_use == 1
        assert pool.acquire().index != 3
        for taken_missing_or_out_of_range in (3, 7, 16):
            with pytest.raises(SlotPoolError):
                pool.adopt(taken_missing_or_out_of_range)
        assert reclaim_orphans(PREFIX, keep=pool.owned()) == []  # adopted slots are owned
        assert naming.netns(3) in list_owned(PREFIX)
    finally:
        os.close(fd)  # the VMM ends
    pool.release(slot)  # reset, then kept for reuse like any released slot
    assert pool.idle == 1 and not pool.holds(slot)


def test_pools_sharing_a_network_do_not_collide(pool: SlotPool) -> None:
    first = pool.acquire()
    other = SlotPool(prefix="aenvt-b", network=NETWORK, max_slots=4, uid_for_index=lambda i: i)
    try:
        second = other.acquire()  # its own names, but index 0's /30 is taken on the host
        assert second.index != first.index and second.host_addr != first.host_addr
    finally:
        other.close()


def test_pools_creating_at_once_never_pick_the_same_address(pool: SlotPool) -> None:
    # Two node processes (instances) filling their pools at the same moment: an index is
    # seen as taken only once its slot exists, so choosing + creating is one host-wide step.
    other = SlotPool(prefix="aenvt-b", network=NETWORK, max_slots=8, uid_for_index=lambda i: i)
    try:
        with ThreadPoolExecutor(8) as ex:
            slots = list(ex.map(lambda p: p.acquire(), [pool, other] * 4))
        addrs = [s.host_addr for s in slots]
        assert len(set(addrs)) == len(addrs), sorted(addrs)
    finally:
        other.close()


async def test_async_pool(pool: SlotPool) -> None:
    t0 = time.perf_counter()
    slots = await asyncio.gather(*(pool.acquire_async() for _ in range(4)))
    elapsed = time.perf_counter() - t0
    assert len({s.index for s in slots}) == 4
    await asyncio.gather(*(pool.release_async(s) for s in slots))
    assert pool.idle == 4
    assert await pool.prewarm_async(6) == 2 and pool.idle == 6
    print(f"4 concurrent slot creates: {elapsed * 1000:.1f} ms")

    # A caller cancelled while its slot was being made does not leak the slot.
    gate, acquired = threading.Event(), threading.Event()
    real_acquire = pool.acquire

    def gated_acquire() -> Slot:
        gate.wait(10)
        try:
            return real_acquire()
        finally:
            acquired.set()

    pool.acquire = gated_acquire  # type: ignore[method-assign]
    task = asyncio.ensure_future(pool.acquire_async())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.set()
    for _ in range(250):
        if acquired.is_set() and pool.in_use == 0:
            break
        await asyncio.sleep(0.02)
    assert acquired.is_set() and pool.in_use == 0 and pool.idle == 6

    await pool.close_async()
    assert list_owned(PREFIX) == []
