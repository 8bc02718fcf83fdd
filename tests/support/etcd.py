"""Real etcd members on loopback for the tests (Debian's etcd-server): one, or a cluster of
three. Each has its own data directory and ports; everything is removed on exit."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.tls import MutualCerts, make_mutual_certs

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Member:
    name: str
    client_url: str
    peer_url: str
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    tls: MutualCerts | None = None
    extra: tuple[str, ...] = ()

    def argv(self, cluster: str, state: str) -> list[str]:
        tls = [] if self.tls is None else [
            "--cert-file", str(self.tls.server_cert), "--key-file", str(self.tls.server_key),
            "--client-cert-auth", "--trusted-ca-file", str(self.tls.ca)]  # fmt: skip
        return [
            ETCD, "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", cluster, "--initial-cluster-state", state,
            "--initial-cluster-token", "aenv-test", "--heartbeat-interval", "50",
            "--election-timeout", "500", "--log-level", "warn", *tls, *self.extra,
        ]  # fmt: skip

    def start(self, cluster: str, state: str = "new") -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child holds it
        try:
            self.proc = subprocess.Popen(self.argv(cluster, state), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


@dataclass
class EtcdCluster:
    members: list[Member]
    tls: MutualCerts | None = None
    client_cn: str = "aenv"  # whose certificate probes present
    user: str = ""  # etcd's authentication on: aenv's user (secured_etcd)
    password: str = ""

    def verify(self) -> object:
        """What httpx needs to reach a member (its client certificate under TLS)."""
        return True if self.tls is None else self.tls.client_context(self.client_cn)

    def aenv_env(self) -> dict[str, str]:
        """What a node, gateway or CLI is given to reach it (cluster.etcd_*)."""
        env = {"AENV_ETCD_ENDPOINTS": ",".join(self.endpoints)}
        if self.tls is not None:
            cert, key = self.tls.clients[self.client_cn]
            env |= {"AENV_ETCD_CA_FILE": str(self.tls.ca), "AENV_ETCD_CERT_FILE": str(cert),
                    "AENV_ETCD_KEY_FILE": str(key)}
        if self.user:
            env |= {"AENV_ETCD_USER": self.user, "AENV_ETCD_PASSWORD": self.password}
        return env

    def call(self, path: str, body: dict[str, object]) -> dict:  # type: ignore[type-arg]
        """One call of etcd's JSON gateway (`/v3/kv/range`...), as aenv's user if any."""
        with httpx.Client(base_url=self.endpoints[0], verify=self.verify(),  # type: ignore[arg-type]
                          timeout=10) as h:  # fmt: skip
            headers = {}
            if self.user:
                r = h.post("/v3/auth/authenticate",
                           json={"name": self.user, "password": self.password})
                r.raise_for_status()
                headers["Authorization"] = r.json()["token"]
            r = h.post(path, json=body, headers=headers)
            r.raise_for_status()
            return r.json()  # type: ignore[no-any-return]

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    @property
    def initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    def wait_healthy(self, timeout: float = 30.0, members: list[Member] | None = None) -> None:
        deadline = time.monotonic() + timeout
        for m in members or self.members:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(m.client_url + "/health", timeout=1,
                                 verify=self.verify()).json().get(  # type: ignore[arg-type]
                            "health") == "true":
                        break
                if m.proc is not None and m.proc.poll() is not None:
                    raise RuntimeError(f"etcd {m.name} exited:\n{m.log_path.read_text()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd {m.name} not healthy:\n{m.log_path.read_text()}")
                time.sleep(0.05)

    def restart(self, m: Member, sig: int = signal.SIGTERM) -> None:
        m.stop(sig)
        m.start(self.initial_cluster, state="existing")
        self.wait_healthy(members=[m])


@contextlib.contextmanager
def etcd_cluster(size: int = 1, tls: MutualCerts | None = None,
                 extra: tuple[str, ...] = ()) -> Iterator[EtcdCluster]:
    """`tls`: clients on https, with client certificates required (--client-cert-auth);
    `extra`: more etcd flags (--auth-token-ttl ...)."""
    root = Path(tempfile.mkdtemp(prefix="aenvt-etcd-"))
    scheme = "http" if tls is None else "https"
    members = [
        Member(f"m{i}", f"{scheme}://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}",
               root / f"m{i}", root / f"m{i}.log", tls=tls, extra=extra)
        for i in range(size)
    ]  # fmt: skip
    cluster = EtcdCluster(members, tls)
    try:
        for m in members:
            m.start(cluster.initial_cluster)
        cluster.wait_healthy()
        yield cluster
    finally:
        for m in members:
            m.stop(signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def enable_auth(c: EtcdCluster, certs: MutualCerts) -> None:
    """Users root and aenv (read-write on every key), then authentication on."""
    def b64(s: str) -> str:
        return base64.b64encode(s.encode()).decode()

    with httpx.Client(base_url=c.endpoints[0], verify=certs.client_context("root")) as h:
        for path, body in (
            ("user/add", {"name": "root", "password": "root-pw"}),
            ("user/grant", {"user": "root", "role": "root"}),
            ("role/add", {"name": "aenv"}),
            ("role/grant", {"name": "aenv", "perm": {"permType": "READWRITE",
                                                     "key": b64("/"), "range_end": b64("\0")}}),
            ("user/add", {"name": "aenv", "password": "aenv-pw"}),
            ("user/grant", {"user": "aenv", "role": "aenv"}),
            ("enable", {}),
        ):  # fmt: skip
            r = h.post(f"/v3/auth/{path}", json=body)
            assert r.status_code == 200, (path, r.text)


@contextlib.contextmanager
def secured_etcd(where: Path, extra: tuple[str, ...] = ()) -> Iterator[EtcdCluster]:
    """One member as an operator runs it (docs/cluster.md, "The link to etcd"): https,
    client certificates required, users and roles on; probes and `call` go as aenv's user
    with a CN-less certificate (etcd's JSON gateway refuses a CN once auth is on)."""
    certs = make_mutual_certs(where, clients=("", "aenv", "root"))
    with etcd_cluster(1, tls=certs, extra=extra) as c:
        enable_auth(c, certs)
        c.client_cn, c.user, c.password = "", "aenv", "aenv-pw"
        yield c
