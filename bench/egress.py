"""The egress proxy's cost for HTTPS to an allowed domain, against a direct connection to the
same server in the same run.

Run as root:  .venv/bin/python bench/egress.py [--requests 300] [--mib 256]
Everything is on loopback addresses of 127.77.0.0/24: a TLS server on :443, dnsmasq on :53
answering for the domain, and the node's EgressProxy (the code a node runs) with one tenant.
A client bound to the tenant's address stands for the guest after the slot's DNAT: it
connects to the proxy's TLS port; the direct client connects to the server. No VM: under
TCG the guest's own cost would hide the proxy's. Rows:

- new connection: connect, TLS handshake, one GET, close (p50 and p90, ms);
- open connection: one GET on a kept-alive TLS connection (p50 and p90, ms);
- throughput: one connection downloading `--mib` MiB (MiB/s), the median of `--trials`
  downloads each, direct and proxied alternating.

Goal (issue 15): proxied latency at most 1.2x direct, throughput at least 0.8x direct.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import http.server
import ipaddress
import multiprocessing as mp
import socket
import ssl
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aenv.network.egress import EgressPolicy, EgressSets
from aenv.network.egress_proxy import EgressProxy
from tests.support.internet import Dnsmasq
from tests.support.tls import make_certs

SERVER, DNS, PROXY_LOCAL, TENANT = "127.77.0.1", "127.77.0.53", "127.77.0.2", "127.77.0.3"
NAME = "api.bench.test"
# As compile_sets makes them for a policy with a domain, except that loopback, "never" to a
# real sandbox, is open here.
OPEN = EgressSets(never=(), allow_special=(), special=(), allow_out=(), deny_out=(),
                  allow_default=(), proxied=(ipaddress.IPv4Network("0.0.0.0/0"),))


class _Conn(http.client.HTTPSConnection):
    """HTTPS to `NAME` (SNI and certificate) at a given address, from a given source."""

    def __init__(self, addr: str, port: int, ctx: ssl.SSLContext, source: str | None) -> None:
        super().__init__(NAME, 443, context=ctx, source_address=(source, 0) if source else None)
        self._addr = (addr, port)

    def connect(self) -> None:
        sock = socket.create_connection(self._addr, 10, self.source_address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._context.wrap_socket(sock, server_hostname=NAME)  # type: ignore[attr-defined]


def _get(c: _Conn, path: str = "/") -> int:
    c.request("GET", path)
    r = c.getresponse()
    return len(r.read())


def _pcts(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=10)
    return statistics.median(xs), q[8]


def latency(addr: str, port: int, source: str | None, ctx: ssl.SSLContext, n: int
            ) -> tuple[tuple[float, float], tuple[float, float]]:  # fmt: skip
    fresh = []
    for _ in range(n):
        t0 = time.perf_counter()
        c = _Conn(addr, port, ctx, source)
        _get(c)
        c.close()
        fresh.append((time.perf_counter() - t0) * 1000)
    c = _Conn(addr, port, ctx, source)
    _get(c)
    kept = []
    for _ in range(n):
        t0 = time.perf_counter()
        _get(c)
        kept.append((time.perf_counter() - t0) * 1000)
    c.close()
    return _pcts(fresh), _pcts(kept)


def throughput(addr: str, port: int, source: str | None, ctx: ssl.SSLContext) -> float:
    c = _Conn(addr, port, ctx, source)
    t0 = time.perf_counter()
    got = _get(c, "/big")
    rate = got / (1 << 20) / (time.perf_counter() - t0)
    c.close()
    return rate


def _https_server(cert: str, key: str, mib: int, ready: Connection) -> None:
    """In a process of its own (its own GIL), as the remote server is."""
    big = b"x" * (mib << 20)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def do_GET(self) -> None:
            data = big if self.path == "/big" else b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer((SERVER, 443), Handler, bind_and_activate=False)
    srv.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.server_bind()
    srv.server_activate()
    # http.server writes head and body apart: without this, delayed ACKs cost 40 ms.
    srv.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    srv.socket = tls.wrap_socket(srv.socket, server_side=True)
    ready.send(True)
    srv.serve_forever()


def _proxy(ready: Connection) -> None:
    """The node's EgressProxy with one tenant, in a process of its own as in a node."""
    async def run() -> None:
        proxy = EgressProxy()
        await proxy.start()
        policy = EgressPolicy.from_request(False, [NAME], dns_servers=[DNS])
        proxy.admit(TENANT, policy, OPEN)
        ready.send(proxy.ports)
        await asyncio.Event().wait()

    asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        certs = make_certs(Path(d), "bench.test")
        client_tls = ssl.create_default_context(cafile=str(certs.ca))
        dns = Dnsmasq(DNS, {NAME: SERVER}, Path(d))
        procs = []
        try:
            ports: tuple[int, ...] = ()
            for target, extra in ((_https_server, (str(certs.cert), str(certs.key), args.mib)),
                                  (_proxy, ())):  # fmt: skip
                mine, theirs = mp.Pipe()
                p = mp.Process(target=target, args=(*extra, theirs), daemon=True)
                p.start()
                procs.append(p)
                if not mine.poll(30):
                    raise SystemExit(f"{target.__name__} did not start")
                got = mine.recv()
                ports = got if isinstance(got, tuple) else ports
            ends = {"direct": (SERVER, 443, None), "proxied": (PROXY_LOCAL, ports[1], TENANT)}
            lat = {k: latency(*v, client_tls, args.requests) for k, v in ends.items()}
            # Alternated, medians: one download swings with how the 2 cores are shared.
            rates: dict[str, list[float]] = {k: [] for k in ends}
            for _ in range(args.trials):
                for k, v in ends.items():
                    rates[k].append(throughput(*v, client_tls))
        finally:
            for p in procs:
                p.terminate()
                p.join()
            dns.close()
    d, p_ = lat["direct"], lat["proxied"]
    rd, rp = (statistics.median(rates[k]) for k in ends)
    print(f"HTTPS to an allowed domain: {args.requests} requests each; "
          f"{args.trials} downloads of {args.mib} MiB each (median)")
    print(f"{'':24}{'direct':>16}{'proxied':>16}{'ratio':>8}")
    for label, i in (("new connection ms", 0), ("open connection ms", 1)):
        print(f"{label + ' p50/p90':24}{d[i][0]:>8.2f}/{d[i][1]:<7.2f}"
              f"{p_[i][0]:>8.2f}/{p_[i][1]:<7.2f}{p_[i][0] / d[i][0]:>7.2f}x")  # fmt: skip
    print(f"{'throughput MiB/s':24}{rd:>16.0f}{rp:>16.0f}{rp / rd:>7.2f}x")


if __name__ == "__main__":
    main()
