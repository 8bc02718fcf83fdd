"""Node benchmark: create latency over the HTTP API, the data-plane proxy's overhead, and the
throughput of GET /health.

Run as root after `aenv setup`:  .venv/bin/python bench/node.py [--n 20] [--runs 300]
It starts its own `aenv server` (its own AENV_INSTANCE, a free loopback port, debug logs) on
the node's data dir ($AENV_DATA_DIR, default /var/lib/aenv), prints a table and stops it.
Nothing is asserted (targets live in the issue notes).

- create: `POST /v2/sandboxes` of `base`, one at a time, timed at the client; each is killed
  before the next (the kill is timed too). Per-stage times come from the node's debug log.
- proxy overhead: the same sandbox through the node (`E2B_SANDBOX_URL` = the node) and
  straight at its agent (`http://<slot address>:49983`, the address the node logs at create):
  the E2B SDK's `commands.run('true')`, and a bare keep-alive `GET /health`. Alternated one
  by one; overhead = p50(proxied) - p50(direct), and the median of the paired differences.
  Under TCG a command's own time varies by tens of ms, which swamps a sub-ms overhead; the
  `GET /health` rows and the stand-in-agent rows below measure the proxy itself.
- WebSocket echo: round trips of an 8-byte binary message on one open WebSocket to a
  stdlib echo server (`tests/support/ws_echo.py`) started in the sandbox with the SDK,
  through the node (header routing) and straight at `ws://<slot address>:8765`, alternated
  one by one (`--ws-runs`, default 1000 each); also against a local echo server in the
  fake-runtime part. The client offers no compression, as the echo server takes none: with
  permessage-deflate on the client's hop the node spends ~0.15 ms more per round trip.
- the proxy alone: a node with AENV_RUNTIME=fake in front of a local stand-in agent (a
  minimal HTTP/1.1 server): latency via the node vs direct, the node's CPU per proxied
  request, and proxied vs direct req/s.
- GET /health req/s: `wrk` (Debian package) when installed, else a bounded asyncio loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx

AGENT_PORT = 49983
DATA_DIR = Path(os.environ.get("AENV_DATA_DIR", "/var/lib/aenv"))
WS_ECHO = Path(__file__).resolve().parent.parent / "tests" / "support" / "ws_echo.py"
WS_PORT = 8765


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def ms(x: float) -> str:
    return f"{x * 1000:.2f} ms" if x < 0.1 else f"{x * 1000:.0f} ms"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    def __init__(self, log: Path, **extra_env: str) -> None:
        self.port = free_port()
        self.extra_env = extra_env
        self.key = "bench-" + os.urandom(8).hex()
        self.log = log
        self.origin = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.instance = "b" + os.urandom(3).hex()

    def start(self) -> None:
        env = {
            **os.environ, "AENV_DATA_DIR": str(DATA_DIR), "AENV_API_KEY": self.key,
            "AENV_INSTANCE": self.instance, "AENV_HOST": "127.0.0.1",
            "AENV_PORT": str(self.port), "AENV_LOG_LEVEL": "debug", **self.extra_env,
        }  # fmt: skip
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aenv.cli.main", "server"],
            env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"aenv server exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.origin + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SystemExit("aenv server did not start in 90 s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        # The instance was this run's own: its (empty) VM directory and database go with it.
        with contextlib.suppress(OSError):
            (DATA_DIR / "sandboxes" / self.instance).rmdir()
        for f in DATA_DIR.glob(f"{self.instance}.db*"):
            f.unlink(missing_ok=True)

    def cpu_s(self) -> float:
        """User + system CPU seconds the node process has used so far."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.origin, headers={"X-API-Key": self.key}, timeout=120)

    def slot_addr(self, sandbox_id: str) -> str:
        pat = re.compile(rf"event=sandbox\.created sandbox_id={sandbox_id} .*slot=(\S+)")
        for line in self.log.read_text(errors="replace").splitlines():
            m = pat.search(line)
            if m:
                return m.group(1)
        raise RuntimeError(f"no slot address logged for {sandbox_id}")


def gateway_for(node: Node, env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """An `aenv gateway` of the cluster `env` names (etcd, token, prefix) in front of
    `node`, once it sees the node: the process and its origin."""
    port = free_port()
    with log.open("ab") as out:
        gw = subprocess.Popen([sys.executable, "-m", "aenv.cli.main", "gateway", "--port",
                               str(port)], stdout=out, stderr=out,
                              env={**os.environ, **env, "AENV_API_KEY": node.key,
                                   "AENV_HOST": "127.0.0.1"})  # fmt: skip
    via = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(via + "/health", timeout=1).json()["nodes"] == 1:
                return gw, via
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() > deadline:
            gw.kill()
            raise SystemExit("the gateway did not see the node")
        time.sleep(0.2)


@contextlib.contextmanager
def sdk_node(**extra_env: str) -> Iterator[Node]:
    """A node with no pools (their VMs would boot beside the samples on these few cores),
    and the E2B SDK's environment pointed at it, for as long as the block."""
    with tempfile.TemporaryDirectory() as tmp:
        node = Node(Path(tmp, "node.log"), AENV_WARM_POOL_SIZE="0", AENV_PRIMED_POOL_SIZE="0",
                    AENV_PRIMED_SNAPSHOT_POOL_SIZE="0")
        node.start()
        try:
            os.environ.update(E2B_API_KEY=node.key, E2B_API_URL=node.origin,
                              E2B_SANDBOX_URL=node.origin, E2B_VOLUME_API_URL=node.origin,
                              **extra_env)  # fmt: skip
            yield node
        finally:
            node.stop()


def bench_create(node: Node, n: int) -> tuple[list[float], list[float]]:
    creates, kills = [], []
    with node.api() as c:
        for _ in range(n):
            t0 = time.perf_counter()
            r = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 120})
            creates.append(time.perf_counter() - t0)
            r.raise_for_status()
            sid = r.json()["sandboxID"]
            t0 = time.perf_counter()
            c.delete(f"/sandboxes/{sid}").raise_for_status()
            kills.append(time.perf_counter() - t0)
    return creates, kills


def stage_times(log: Path) -> dict[str, list[float]]:
    """`event=stage op=… stage=… ms=…` lines and the runtime's `restore …: a=Xms b=Yms` line."""
    out: dict[str, list[float]] = defaultdict(list)
    stage = re.compile(r"event=stage op=(\w+) stage=(\w+) .*?ms=([\d.]+) outcome=ok")
    restore = re.compile(r'event="restore \w+(?: \((\w+)\))?: (.*)"')  # "(warm)": pooled VMM
    for line in log.read_text(errors="replace").splitlines():
        if m := stage.search(line):
            out[f"{m.group(1)}: {m.group(2)}"].append(float(m.group(3)) / 1000)
        elif m := restore.search(line):
            kind = m.group(1) or "cold"
            out[f"create: runtime_create > restores ({kind})"].append(0.0)
            for part in m.group(2).split():
                name, _, val = part.partition("=")
                if val.endswith("ms"):
                    out[f"create: runtime_create > {name}"].append(float(val[:-2]) / 1000)
    return out


def timed(fn, runs: int) -> list[float]:  # type: ignore[no-untyped-def]
    xs = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return xs


def interleaved(a, b, runs: int) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    """`runs` timings of each, in pairs (a then b, then b then a, ...): drift and ordering
    effects hit both alike, and xa[i] - xb[i] is a paired difference."""
    timed(a, 10)  # warm both paths (connections, caches)
    timed(b, 10)
    xa: list[float] = []
    xb: list[float] = []
    for i in range(runs):
        if i % 2:
            xb += timed(b, 1)
            xa += timed(a, 1)
        else:
            xa += timed(a, 1)
            xb += timed(b, 1)
    return xa, xb


def overhead(via: list[float], direct: list[float]) -> str:
    p50 = statistics.median(via) - statistics.median(direct)
    paired = statistics.median(v - d for v, d in zip(via, direct, strict=True))
    return f"{p50 * 1000:.2f} ms (paired median {paired * 1000:.2f} ms)"


Samples = list[tuple[str, list[float], list[float]]]


def ws_echo(via: str, headers: dict[str, str], direct: str, runs: int) -> tuple[
        list[float], list[float]]:  # fmt: skip
    """Round trips of a small binary message on one WebSocket each: via the node, direct."""
    from websockets.sync.client import connect

    msg = b"8 bytes!"

    def round_trip(c) -> None:  # type: ignore[no-untyped-def]
        c.send(msg)
        assert c.recv(timeout=30) == msg

    with connect(via, additional_headers=headers, proxy=None, compression=None) as pc, \
            connect(direct, proxy=None, compression=None) as dc:  # fmt: skip
        return interleaved(lambda: round_trip(pc), lambda: round_trip(dc), runs)


def wait_ws(uri: str, deadline_s: float = 60) -> None:
    from websockets.sync.client import connect

    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with connect(uri, proxy=None, open_timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def bench_proxy(
    node: Node, runs: int, seconds: int, ws_runs: int
) -> tuple[Samples, tuple[float, str]]:
    from e2b import Sandbox

    os.environ.update(E2B_API_URL=node.origin, E2B_SANDBOX_URL=node.origin, E2B_API_KEY=node.key)
    sbx = Sandbox.create("base", timeout=600)
    try:
        slot = node.slot_addr(sbx.sandbox_id)
        direct_url = f"http://{slot}:{AGENT_PORT}"
        direct = Sandbox.connect(sbx.sandbox_id, sandbox_url=direct_url)
        assert direct.commands.run("true").exit_code == 0
        rows = []
        cmd_p, cmd_d = interleaved(lambda: sbx.commands.run("true"),
                                   lambda: direct.commands.run("true"), runs)  # fmt: skip
        rows.append(("commands.run('true')", cmd_p, cmd_d))
        hdr = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(AGENT_PORT)}
        with httpx.Client(base_url=node.origin, headers=hdr) as pc, \
                httpx.Client(base_url=direct_url) as dc:  # fmt: skip
            h_p, h_d = interleaved(lambda: pc.get("/health").raise_for_status(),
                                   lambda: dc.get("/health").raise_for_status(),
                                   runs * 3)  # fmt: skip
        rows.append(("GET /health (agent)", h_p, h_d))
        sbx.files.write("/tmp/ws_echo.py", WS_ECHO.read_text())
        sbx.commands.run(f"python3 /tmp/ws_echo.py {WS_PORT}", background=True)
        direct_ws = f"ws://{slot}:{WS_PORT}/"
        wait_ws(direct_ws)
        ws_hdr = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(WS_PORT)}
        via_ws = node.origin.replace("http://", "ws://") + "/"
        ws_p, ws_d = ws_echo(via_ws, ws_hdr, direct_ws, ws_runs)
        rows.append(("WebSocket echo (8 B)", ws_p, ws_d))
        return rows, rps(node.origin + "/health", seconds, hdr)
    finally:
        sbx.kill()


_UPSTREAM_REPLY = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
)


async def serve_upstream(port: int) -> None:
    """A minimal keep-alive HTTP/1.1 server answering every GET with `{}`: a stand-in agent
    whose own cost is near zero, so what the node adds stands out."""

    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                writer.write(_UPSTREAM_REPLY)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(conn, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def bench_proxy_isolated(runs: int, seconds: int, ws_runs: int) -> list[tuple[str, str]]:
    """The proxy alone: a node with AENV_RUNTIME=fake in front of a local stand-in agent."""
    up_port = free_port()
    up = subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(up_port)])
    ws_port = free_port()
    ws_up = subprocess.Popen([sys.executable, str(WS_ECHO), str(ws_port)])
    node = Node(Path(tempfile.mkdtemp(prefix="aenv-bench-")) / "server.log", AENV_RUNTIME="fake")
    rows = []
    try:
        node.start()
        with node.api() as c:
            sid = c.post("/v2/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
        hdr = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(up_port)}
        direct_url = f"http://127.0.0.1:{up_port}"
        with httpx.Client(base_url=node.origin, headers=hdr) as pc, \
                httpx.Client(base_url=direct_url) as dc:  # fmt: skip
            get_p = lambda: pc.get("/health").raise_for_status()  # noqa: E731
            get_d = lambda: dc.get("/health").raise_for_status()  # noqa: E731
            via, direct = interleaved(get_p, get_d, runs)
            cpu0 = node.cpu_s()
            timed(get_p, runs)
            cpu = (node.cpu_s() - cpu0) / runs
        rows += [
            (f"GET via node p50 / p95 (n={runs})", f"{ms(pct(via, 50))} / {ms(pct(via, 95))}"),
            ("GET direct p50 / p95", f"{ms(pct(direct, 50))} / {ms(pct(direct, 95))}"),
            ("proxy overhead (p50 diff)", overhead(via, direct)),
            ("node CPU per proxied request", f"{cpu * 1000:.2f} ms"),
        ]
        r, how = rps(node.origin + "/health", seconds, hdr)
        rows.append((f"proxied GET req/s ({how})", f"{r:,.0f}"))
        r, how = rps(direct_url + "/health", seconds)
        rows.append((f"direct GET req/s ({how})", f"{r:,.0f}"))
        direct_ws = f"ws://127.0.0.1:{ws_port}/"
        wait_ws(direct_ws)
        ws_hdr = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": str(ws_port)}
        via, direct = ws_echo(node.origin.replace("http://", "ws://") + "/", ws_hdr, direct_ws,
                              ws_runs)  # fmt: skip
        rows += [
            (f"WebSocket echo via node p50 / p95 (n={ws_runs})",
             f"{ms(pct(via, 50))} / {ms(pct(via, 95))}"),
            ("WebSocket echo direct p50 / p95", f"{ms(pct(direct, 50))} / {ms(pct(direct, 95))}"),
            ("WebSocket proxy overhead (p50 diff)", overhead(via, direct)),
        ]  # fmt: skip
    finally:
        node.stop()
        for p in (up, ws_up):
            p.terminate()
            p.wait()
    return [(f"[fake runtime, local upstream] {k}", v) for k, v in rows]


def wrk(url: str, seconds: int, headers: dict[str, str] | None = None) -> float | None:
    exe = shutil.which("wrk")
    if exe is None:
        return None
    args = [exe, "-t2", "-c32", f"-d{seconds}s", "--latency"]
    for k, v in (headers or {}).items():
        args += ["-H", f"{k}: {v}"]
    out = subprocess.run([*args, url], capture_output=True, text=True, timeout=seconds + 30)
    m = re.search(r"Requests/sec:\s+([\d.]+)", out.stdout)
    return float(m.group(1)) if m else None


async def loop_rps(url: str, seconds: float, conc: int = 32) -> float:
    done = 0
    stop = time.perf_counter() + seconds
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=conc)) as c:

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                (await c.get(url)).raise_for_status()
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        return done / (time.perf_counter() - t0)


def rps(url: str, seconds: int, headers: dict[str, str] | None = None) -> tuple[float, str]:
    r = wrk(url, seconds, headers)
    if r is not None:
        return r, "wrk -t2 -c32"
    if headers:
        return float("nan"), "needs wrk"
    return asyncio.run(loop_rps(url, seconds)), "httpx loop, 32 conns"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20, help="creates to time")
    ap.add_argument("--runs", type=int, default=300, help="commands.run('true') per path")
    ap.add_argument("--seconds", type=int, default=5, help="GET /health load duration")
    ap.add_argument("--ws-runs", type=int, default=1000, help="WebSocket echoes per path")
    ap.add_argument("--only", choices=["vm", "proxy"], help="only the real-VM part, or only "
                    "the proxy against a local stand-in agent (no VMs)")  # fmt: skip
    ap.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_upstream:
        asyncio.run(serve_upstream(args.serve_upstream))
        return
    rows: list[tuple[str, str]] = []
    if args.only != "proxy":
        rows += bench_vm(args)
    if args.only != "vm":
        rows += bench_proxy_isolated(args.runs * 3, args.seconds, args.ws_runs)
    w = max(len(k) for k, _ in rows)
    print(f"{'metric':<{w}}  value")
    print("-" * (w + 20))
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


def bench_vm(args: argparse.Namespace) -> list[tuple[str, str]]:
    log = Path(tempfile.mkdtemp(prefix="aenv-bench-")) / "server.log"
    node = Node(log)
    node.start()
    rows: list[tuple[str, str]] = []
    try:
        creates, kills = bench_create(node, args.n)
        rows.append((f"create (HTTP, n={args.n}) p50 / p95",
                     f"{ms(pct(creates, 50))} / {ms(pct(creates, 95))}"))  # fmt: skip
        rows.append((f"kill (HTTP, n={args.n}) p50 / p95",
                     f"{ms(pct(kills, 50))} / {ms(pct(kills, 95))}"))  # fmt: skip
        for name, xs in sorted(stage_times(log).items()):
            if name.endswith(")"):  # a count, not a time
                rows.append((f"  stage {name}", str(len(xs))))
            elif name.startswith(("create", "kill")):
                rows.append((f"  stage {name} p50 / p95 (n={len(xs)})",
                             f"{ms(pct(xs, 50))} / {ms(pct(xs, 95))}"))  # fmt: skip
        proxy_rows, proxied_rps = bench_proxy(node, args.runs, args.seconds, args.ws_runs)
        for what, via, direct in proxy_rows:
            rows.append((f"{what} via node p50 / p95 (n={len(via)})",
                         f"{ms(pct(via, 50))} / {ms(pct(via, 95))}"))  # fmt: skip
            rows.append((f"{what} direct p50 / p95",
                         f"{ms(pct(direct, 50))} / {ms(pct(direct, 95))}"))  # fmt: skip
            rows.append((f"{what} proxy overhead (p50 diff)", overhead(via, direct)))
        r, how = rps(node.origin + "/health", args.seconds)
        rows.append((f"GET /health req/s ({how}, {args.seconds} s)", f"{r:,.0f}"))
        r, how = proxied_rps
        rows.append((f"GET /health via proxy to the agent req/s ({how})", f"{r:,.0f}"))
    finally:
        node.stop()
    return rows


if __name__ == "__main__":
    main()
