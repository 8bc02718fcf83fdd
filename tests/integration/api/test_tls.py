"""A single node terminating TLS (issue 14, item 2) with a wildcard certificate from a test
CA: the unmodified SDK, given nothing but E2B_DOMAIN, the API key and the CA (in
SSL_CERT_FILE, which the SDK's rustls reads), calls https://api.<domain> and reaches the
node. The client runs in a namespace whose own resolver answers for the domain
(tests/support/client_ns.py). The node runs on the fake runtime: the gateway's e2e test
(tests/e2e/test_gateway.py) runs the whole scenario over TLS on real VMs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.client_ns import client_namespace
from tests.support.cluster import Child, aenv
from tests.support.tls import make_certs

DOMAIN = "aenv-tls.test"
KEY = "tls-test-key"
REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="namespaces need root")

SCRIPT = """
from e2b import Sandbox
s = Sandbox.create(timeout=60, metadata={"via": "tls"})
assert s.sandbox_id in [x.sandbox_id for x in Sandbox.list().next_items()]
assert s.get_info().metadata == {"via": "tls"}
assert Sandbox.kill(s.sandbox_id) is True
print("ok", s.sandbox_id)
"""


def test_the_sdk_reaches_a_tls_node_with_only_e2b_domain(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs", DOMAIN)
    with client_namespace(DOMAIN) as ns:
        (tmp_path / "node").mkdir()
        node = Child(aenv("server"), 443, tmp_path / "node.log", {
            "AENV_RUNTIME": "fake", "AENV_DATA_DIR": str(tmp_path / "node"),
            "AENV_INSTANCE": "tls" + os.urandom(2).hex(), "AENV_API_KEY": KEY,
            "AENV_HOST": ns.server_ip, "AENV_PORT": "443", "AENV_DOMAIN": DOMAIN,
            "AENV_TLS_CERT_FILE": str(certs.cert), "AENV_TLS_KEY_FILE": str(certs.key),
        })  # fmt: skip
        node.start(lambda: httpx.get(f"https://{ns.server_ip}/health", timeout=1,
                                     verify=certs.by_address()).status_code == 200)  # fmt: skip
        try:
            # Plain HTTP to the TLS port is refused, and the name is what the cert says.
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"http://{ns.server_ip}:443/health", timeout=2)
            env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
                   "E2B_DOMAIN": DOMAIN, "E2B_API_KEY": KEY, "SSL_CERT_FILE": str(certs.ca)}
            r = ns.run([sys.executable, "-c", SCRIPT], env, timeout=120)
            assert r.returncode == 0 and r.stdout.startswith("ok "), r.stdout + r.stderr
            # Without the CA the SDK refuses the certificate: it is TLS that was verified.
            del env["SSL_CERT_FILE"]
            r = ns.run([sys.executable, "-c", SCRIPT], env, timeout=120)
            assert r.returncode != 0
        finally:
            assert node.stop() == 0, node.tail()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert ns.name not in listed  # the client's namespace went with it
