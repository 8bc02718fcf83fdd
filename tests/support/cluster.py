"""Processes of a cluster for the tests: nodes on the fake runtime (no VMs), gateways, and
Debian's haproxy in front of them, each a real child process on loopback."""

from __future__ import annotations

import contextlib
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.host import ServerProcess, free_port

START_DEADLINE_S = 60
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


@dataclass
class Child(ServerProcess):
    """`python -m aenv.cli.main ARGS` (or any argv) on `port`, ready when `ready()` holds."""

    argv: list[str]
    port: int
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready: Callable[[], bool] | None = None) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(self.argv, env={**os.environ, **self.env}, stdout=out,
                                     stderr=out, stdin=subprocess.DEVNULL)  # fmt: skip
        ready = ready or self.healthy
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.argv} exited with {self.proc.returncode}:\n"
                                     f"{self.tail()}")  # fmt: skip
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                if ready():
                    return
            time.sleep(0.1)
        self.kill9()
        raise AssertionError(f"{self.argv} not ready in {START_DEADLINE_S} s:\n{self.tail()}")

    def healthy(self) -> bool:
        return httpx.get(self.origin + "/health", timeout=1).status_code == 200


def aenv(*args: str) -> list[str]:
    return [sys.executable, "-m", "aenv.cli.main", *args]


def cluster_env(endpoints: list[str], prefix: str, token: str) -> dict[str, str]:
    return {"AENV_ETCD_ENDPOINTS": ",".join(endpoints), "AENV_CLUSTER_PREFIX": prefix,
            "AENV_CLUSTER_TOKEN": token, "AENV_LOG_LEVEL": "info"}  # fmt: skip


def fake_node(tmp: Path, name: str, env: dict[str, str], api_key: str, **extra: str) -> Child:
    port = free_port()
    (tmp / name).mkdir(parents=True, exist_ok=True)
    return Child(aenv("server"), port, tmp / f"{name}.log", {
        **env, "AENV_RUNTIME": "fake", "AENV_DATA_DIR": str(tmp / name),
        "AENV_INSTANCE": name, "AENV_API_KEY": api_key, "AENV_HOST": "127.0.0.1",
        "AENV_PORT": str(port), "AENV_NODE_NAME": name, **extra})  # fmt: skip


def gateway(tmp: Path, name: str, env: dict[str, str], api_key: str, *, host: str = "127.0.0.1",
            port: int | None = None, **extra: str) -> Child:
    port = port or free_port()
    return Child(aenv("gateway", "--port", str(port)), port, tmp / f"{name}.log",
                 {**env, "AENV_API_KEY": api_key, "AENV_HOST": host, **extra})


def gateway_ready(g: Child, nodes: int, origin: str | None = None,
                  verify: ssl.SSLContext | bool = True) -> Callable[[], bool]:  # fmt: skip
    """It answers /health (at `origin`: its own by default) and sees `nodes` nodes."""
    url = (origin or g.origin) + "/health"
    return lambda: httpx.get(url, timeout=1, verify=verify).json()["nodes"] == nodes


def haproxy(tmp: Path, backends: list[Child], *, bind: str = "127.0.0.1",
            port: int | None = None, tcp: bool = False) -> Child:  # fmt: skip
    """One frontend, round robin over `backends`, health-checked every 200 ms. A connection
    that fails, or (HTTP) a backend that closes without answering, is tried on the next.
    `tcp`: TLS passes through to the backends, which terminate it (health: a connect)."""
    port = port or free_port()
    servers = "\n".join(f"    server b{i} 127.0.0.1:{b.port} check inter 200ms fall 1 rise 1"
                        for i, b in enumerate(backends))  # fmt: skip
    # HTTP mode: a client that leaves closes the request to the gateway too (abortonclose),
    # as a TCP-mode balancer would, so the gateway sees it leave (issue 31: no orphans).
    http = "" if tcp else "    retry-on conn-failure empty-response\n    option abortonclose\n"
    check = "" if tcp else "    option httpchk GET /health\n"
    cfg = tmp / ("haproxy-tcp.cfg" if tcp else "haproxy.cfg")
    cfg.write_text(f"""global
    maxconn 2000
defaults
    mode {"tcp" if tcp else "http"}
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    retries 3
    option redispatch
{http}frontend fe
    bind {bind}:{port}
    default_backend gateways
backend gateways
    balance roundrobin
{check}{servers}
""")
    return Child([HAPROXY, "-db", "-f", str(cfg)], port, cfg.with_suffix(".log"))


def link_env(tmp: Path, name: str, *, node: bool = True) -> dict[str, str]:
    """The environment that puts a node or gateway `name` on the cluster's TLS links
    (cluster/links.py): the test cluster's CA (made once in `tmp`/links-ca), a certificate
    for `name`, and for a node its cluster listener's port."""
    from aenv.cluster import ca

    d = tmp / "links-ca"
    if not (d / "ca.pem").exists():
        ca.init(d)
    cert, key = ca.issue(d, name, ["127.0.0.1", "localhost"])
    env = {"AENV_CLUSTER_CA_FILE": str(d / "ca.pem"), "AENV_CLUSTER_CERT_FILE": str(cert),
           "AENV_CLUSTER_KEY_FILE": str(key)}
    if node:
        env["AENV_CLUSTER_LINK_PORT"] = str(free_port())
    return env
