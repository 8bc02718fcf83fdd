"""A namespace standing for "the internet" (198.19.200.x, the benchmark range, never off the
machine): one veth to the host with forwarding on for it alone, and a TCP and a UDP sink.
Routing guests to it is the caller's part (forwarding on their slot veths)."""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import os
import random
import secrets
import socket
import socketserver
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import IPRoute

from aenv.network import netns as ns
from aenv.network.pool import address_is_local
from tests.support import daemons


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def forwarding(ifname: str, on: bool) -> None:
    """Per interface, never host-wide: forwarding of what arrives on ifname."""
    Path(f"/proc/sys/net/ipv4/conf/{ifname}/forwarding").write_text("1" if on else "0")


class UdpSink:
    """A UDP socket (in the calling thread's namespace) that records datagrams carrying the
    test's marker."""

    def __init__(self, port: int, marker: bytes) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("0.0.0.0", port))
        self.sock.setblocking(False)
        self.marker = marker

    def received(self) -> list[str]:
        """Sources of the marked datagrams that arrived since the last call."""
        got = []
        while True:
            try:
                data, src = self.sock.recvfrom(2048)
            except BlockingIOError:
                return got
            if self.marker in data:
                got.append(src[0])

    def close(self) -> None:
        self.sock.close()


class TcpSink:
    """A TCP listener (in the calling thread's namespace) recording who connected."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", port))
        self.sock.listen(64)
        self.peers: list[str] = []
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.peers.append(peer[0])
            conn.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._t.join(timeout=5)




@contextlib.contextmanager
def slots_forwarding(instance: str) -> Iterator[None]:
    """Forwarding on for the host veths of `instance`'s slots as they appear (the route out
    is the operator's, docs/security.md): only what the slot rules let out is forwarded."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.1):
            for name in os.listdir("/sys/class/net"):
                if name.startswith(f"{instance}-") and name.endswith("h"):
                    with contextlib.suppress(OSError):
                        forwarding(name, True)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


class _QuietServer(http.server.ThreadingHTTPServer):
    def server_bind(self) -> None:
        # HTTPServer would resolve its own name by DNS, which a test namespace may not have.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]  # type: ignore[assignment]


class HttpServer:
    """An HTTP server answering every GET with `body`, or with `body(client address)`, and
    recording the Host and the headers of each request; HTTPS with `tls`. Its socket lives
    in the namespace of the thread that makes it (ns.run_in_netns)."""

    def __init__(self, port: int, body: bytes | Callable[[str], bytes],
                 addr: str = "0.0.0.0", tls: ssl.SSLContext | None = None) -> None:
        self.hosts: list[str] = []
        self.requests: list[dict[str, str]] = []  # every request's headers (lower-case names)
        hosts, requests = self.hosts, self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hosts.append(self.headers.get("Host", ""))
                requests.append({k.lower(): v for k, v in self.headers.items()})
                data = body(self.client_address[0]) if callable(body) else body
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = _QuietServer((addr, port), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self._t = threading.Thread(target=self.server.serve_forever, daemon=True,
                                   kwargs={"poll_interval": 0.05})
        self._t.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Internet:
    """A namespace standing for the internet: one veth to the host, a TCP and a UDP sink."""

    name: str
    host_if: str
    net: ipaddress.IPv4Network
    host_addr: str
    addr: str
    # A host address outside every special range, as a host with a public address has one
    # (192.88.99.0/24: the retired 6to4 anycast prefix): only "never" keeps guests off it.
    host_public: str
    tcp_port: int
    udp_port: int
    marker: bytes
    tcp: TcpSink | None = None
    udp: UdpSink | None = None

    def create(self) -> None:
        path = ns.create_netns(self.name)
        host_ns = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            ns.run_in_netns(path, self._configure_inside, host_ns)
        finally:
            os.close(host_ns)
        with IPRoute() as ipr:
            idx = socket.if_nametoindex(self.host_if)
            ipr.addr("add", index=idx, address=self.host_addr, prefixlen=30)
            ipr.addr("add", index=idx, address=self.host_public, prefixlen=32)
            ipr.link("set", index=idx, state="up")
        forwarding(self.host_if, True)  # replies to the slots come in here
        self.tcp = ns.run_in_netns(path, TcpSink, self.tcp_port)
        self.udp = ns.run_in_netns(path, UdpSink, self.udp_port, self.marker)

    def _configure_inside(self, host_ns: int) -> None:
        with IPRoute() as ipr:
            ipr.link("set", index=socket.if_nametoindex("lo"), state="up")
            ipr.link("add", ifname="eth0", kind="veth",
                     peer={"ifname": self.host_if, "net_ns_fd": host_ns})
            idx = socket.if_nametoindex("eth0")
            ipr.addr("add", index=idx, address=self.addr, prefixlen=30)
            ipr.link("set", index=idx, state="up")
            ipr.route("add", dst="0.0.0.0/0", gateway=self.host_addr)

    def close(self) -> None:
        for sink in (self.tcp, self.udp):
            if sink is not None:
                sink.close()
        ns.delete_netns(self.name)  # its veth pair goes with it
        with IPRoute() as ipr:
            for idx in ipr.link_lookup(ifname=self.host_if):
                ipr.link("del", index=idx)


@contextlib.contextmanager
def internet_namespace() -> Iterator[Internet]:
    tag = secrets.token_hex(3)
    for _ in range(50):
        base = ipaddress.ip_address("198.19.200.0") + 4 * random.randrange(256)
        net = ipaddress.ip_network(f"{base}/30")
        if not any(address_is_local(str(a)) for a in net):
            break
    inet = Internet(name=f"aenvi-{tag}", host_if=f"aenvi{tag}", net=net,
                    host_addr=str(net.network_address + 1), addr=str(net.network_address + 2),
                    host_public=f"192.88.99.{random.randrange(1, 255)}",
                    tcp_port=free_port(), udp_port=free_port(),
                    marker=f"aenv-probe-{tag}".encode())
    try:
        inet.create()
        yield inet
    finally:
        inet.close()


class Dnsmasq:
    """A DNS server (dnsmasq, in the namespace of the thread that makes it) answering
    `records` (name -> address; a name also answers for every name below it) and nothing
    else."""

    def __init__(self, addr: str, records: dict[str, str], workdir: Path) -> None:
        args = ["dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv",
                "--no-hosts", "--bind-interfaces", f"--listen-address={addr}", "--port=53",
                f"--pid-file={workdir / 'dnsmasq.pid'}", "--user=root",
                "--log-facility=/dev/null",
                *(f"--address=/{name}/{a}" for name, a in records.items())]  # fmt: skip
        self.proc = daemons.start_listening(args, addr, 53, workdir / "dnsmasq.log")

    def close(self) -> None:
        daemons.stop(self.proc)


@contextlib.contextmanager
def internet_with_http(body: bytes) -> Iterator[tuple[Internet, int]]:
    """The test internet with an HTTP server answering `body` on a free port of its
    address: (the namespace, the port)."""
    with internet_namespace() as inet:
        port = free_port()
        server = ns.run_in_netns(ns.netns_path(inet.name), HttpServer, port, body)
        try:
            yield inet, port
        finally:
            server.close()
