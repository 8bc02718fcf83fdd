"""A network namespace for a client that knows a cluster only by its domain: its own
resolver (dnsmasq inside it, answering `<domain>` and `*.<domain>` with one address on the
host) through `/etc/netns/<ns>/resolv.conf`, which `ip netns exec` mounts over
/etc/resolv.conf for what it runs. The host's resolver and trust store are never touched.

    with client_namespace("aenv.test") as ns:        # the server binds ns.server_ip
        ns.run([python, "-c", "..."], env={...})     # resolves api.aenv.test to it

Addresses: 198.19.255.248/30 (the test range; nodes' slots start at the other end).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HOST_IP = "198.19.255.249"
NS_IP = "198.19.255.250"
DNSMASQ = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"


def _ip(*args: str, ns: str | None = None) -> None:
    argv = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"{' '.join(argv)}: {r.stderr}"


@dataclass
class ClientNs:
    name: str
    server_ip: str

    def run(self, argv: list[str], env: dict[str, str], timeout: float,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:  # fmt: skip
        return subprocess.run(["ip", "netns", "exec", self.name, *argv], env=env, cwd=cwd,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip


@contextlib.contextmanager
def client_namespace(domain: str) -> Iterator[ClientNs]:
    tag = os.urandom(3).hex()
    ns, host_if, ns_if = f"aenvt-c{tag}", f"aenvt{tag}h", f"aenvt{tag}n"
    etc = Path("/etc/netns") / ns
    dns: subprocess.Popen[bytes] | None = None
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", ns)
        _ip("addr", "add", f"{HOST_IP}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("addr", "add", f"{NS_IP}/30", "dev", ns_if, ns=ns)
        _ip("link", "set", ns_if, "up", ns=ns)
        _ip("link", "set", "lo", "up", ns=ns)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        dns = subprocess.Popen(
            ["ip", "netns", "exec", ns, DNSMASQ, "--keep-in-foreground", "--no-resolv",
             "--no-hosts", "--no-poll", "--listen-address=127.0.0.1", "--bind-interfaces",
             "--user=root", f"--address=/{domain}/{HOST_IP}", "--pid-file="],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        deadline = time.monotonic() + 10
        while not _resolves(ns, f"api.{domain}"):
            assert dns.poll() is None, f"dnsmasq exited: {dns.stderr.read() if dns.stderr else ''}"
            assert time.monotonic() < deadline, "dnsmasq does not answer"
            time.sleep(0.1)
        yield ClientNs(ns, HOST_IP)
    finally:
        if dns is not None:
            dns.kill()
            dns.wait()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)
        shutil.rmtree(etc, ignore_errors=True)


def _resolves(ns: str, name: str) -> bool:
    r = subprocess.run(["ip", "netns", "exec", ns, "getent", "hosts", name],
                       capture_output=True, text=True, timeout=10)  # fmt: skip
    return r.returncode == 0 and HOST_IP in r.stdout
