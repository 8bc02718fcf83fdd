"""Domain names in `allowOut` and the `egressProxy`, with real VMs and the unmodified SDK:
the egress proxy lets HTTP (Host) and HTTPS (SNI) through by name, wildcards included, and
refuses the rest, a direct-IP bypass and a name that resolves into a private range
included; with an egressProxy, the TCP the order accepts goes through a real SOCKS5 server
(Dante; with credentials; over TLS through stunnel), and fails closed when it is dead.

The test internet (tests/support/internet.py) holds a DNS server (dnsmasq) answering for
`*.aenv.test`, and HTTP and HTTPS servers (a certificate of a test CA) on ports 80 and 443
that record the Host of every request. The policy names that DNS server as its
`dnsServers`; the guest's `resolv.conf` is left as aenv makes it (its gateway, which the
slot forwards to the policy's first DNS server)."""

from __future__ import annotations

import re
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from e2b import Sandbox, Secret

from aenv.network import netns as ns
from tests.support import census
from tests.support.guest import held_connection
from tests.support.host import guest_ram
from tests.support.internet import (
    Dnsmasq,
    HttpServer,
    Internet,
    internet_namespace,
    slots_forwarding,
)
from tests.support.socks import PASSWORD, USER, Dante, Stunnel
from tests.support.tls import make_certs

from .conftest import NodeProcess, running_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

BODY = b"hello by name\n"
DOMAIN = "aenv.test"
SBX_DOMAIN = f"sbx.{DOMAIN}"  # the node's sandbox URLs: <port>-<id>.sbx.aenv.test
PEER_PORT = 8081


@dataclass
class Web:
    inet: Internet
    http: HttpServer
    https: HttpServer
    ca: str  # PEM
    ca_file: str
    peer: int  # an HTTP server that answers with the client's address
    peer_server: HttpServer
    dante: Dante
    socks: int  # Dante, no credentials
    socks_tls: int  # stunnel in front of Dante with credentials

    def peer_hosts(self) -> list[str]:
        """Host headers the peer server saw since the last call."""
        got = list(self.peer_server.hosts)
        self.peer_server.hosts.clear()
        return got

    def hosts(self) -> list[str]:
        """Host headers both servers saw since the last call."""
        got = self.http.hosts + self.https.hosts
        self.http.hosts.clear()
        self.https.hosts.clear()
        return got


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    tmp = tmp_path_factory.mktemp("web")
    certs = make_certs(tmp, DOMAIN)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(certs.cert, certs.key)
    with internet_namespace() as inet:
        path = ns.netns_path(inet.name)
        # The node's sandbox URLs resolve to an address of the host, as an operator's DNS
        # points them at the node.
        records = {DOMAIN: inet.addr, f"private.w.{DOMAIN}": "10.20.30.40",
                   SBX_DOMAIN: inet.host_addr}  # fmt: skip
        dns = ns.run_in_netns(path, Dnsmasq, inet.addr, records, tmp)
        http = ns.run_in_netns(path, HttpServer, 80, BODY, inet.addr)
        https = ns.run_in_netns(path, HttpServer, 443, BODY, inet.addr, tls)
        peer = ns.run_in_netns(path, HttpServer, PEER_PORT, str.encode, inet.addr)
        dante = ns.run_in_netns(path, Dante, inet.addr, 1080, tmp,
                                hosts={f"api.{DOMAIN}": inet.addr})  # fmt: skip
        creds = ns.run_in_netns(path, Dante, inet.addr, 1081, tmp, credentials=True)
        stunnel = ns.run_in_netns(path, Stunnel, inet.addr, 1443, f"{inet.addr}:1081",
                                  certs.cert, certs.key, tmp)  # fmt: skip
        try:
            yield Web(inet, http, https, certs.ca.read_text(), str(certs.ca), PEER_PORT, peer,
                      dante, 1080, 1443)
        finally:
            for s in (http, https, dns, peer, stunnel, creds, dante):
                s.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, web: Web) -> Iterator[NodeProcess]:
    instance = census.new_instance()
    try:
        with running_node(tmp_path_factory.mktemp("node"), AENV_INSTANCE=instance,
                          AENV_WARM_POOL_SIZE="0", AENV_SLOT_NETWORK="198.18.0.0/16",
                          AENV_NETWORK_PUBLIC_RANGES="198.19.0.0/16",
                          AENV_NETWORK_UPSTREAM_CA_FILE=web.ca_file,
                          AENV_DOMAIN=SBX_DOMAIN) as n, \
                slots_forwarding(instance):  # fmt: skip
            yield n
    finally:
        census.release(instance)


def _sandbox(web: Web, allow: list[str]) -> Sandbox:
    sbx = Sandbox.create(timeout=120, network={
        "allow_out": allow, "deny_out": ["0.0.0.0/0"], "dns_servers": [web.inet.addr]})
    sbx.files.write("/tmp/ca.pem", web.ca)
    return sbx


def _outcomes(node: NodeProcess) -> dict[str, float]:
    text = httpx.get(node.origin + "/metrics", timeout=10).text
    pat = r'^aenv_egress_proxy_connections_total\{outcome="(\w+)"\} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pat, text, re.M)}


def _curl(sbx: Sandbox, url: str, *extra: str) -> str:
    """The body, or `failed <curl's exit code>`."""
    args = " ".join(extra)
    r = sbx.commands.run(f"curl -sS --cacert /tmp/ca.pem --connect-timeout 5 --max-time 20 "
                         f"{args} {url} 2>/dev/null || echo failed $?")  # fmt: skip
    return r.stdout


def test_allowed_names_pass_over_http_and_https_and_others_are_refused(
        node: NodeProcess, web: Web) -> None:  # fmt: skip
    sbx = _sandbox(web, [f"api.{DOMAIN}", f"*.w.{DOMAIN}"])
    try:
        web.hosts()
        for url in (f"https://api.{DOMAIN}/", f"http://api.{DOMAIN}/",
                    f"https://a.w.{DOMAIN}/", f"http://b.c.w.{DOMAIN}:80/"):  # fmt: skip
            # -k for a.w: the test certificate's wildcard covers one label below aenv.test.
            assert _curl(sbx, url, "-k" if "a.w" in url else "") == BODY.decode(), url
        assert web.hosts() == [f"api.{DOMAIN}", f"b.c.w.{DOMAIN}", f"api.{DOMAIN}",
                               f"a.w.{DOMAIN}"]  # fmt: skip  (http first, then https)

        before = _outcomes(node)
        refused = {
            # Not listed; the wildcard's apex; another name on the same address.
            "other": _curl(sbx, f"https://other.{DOMAIN}/"),
            "apex": _curl(sbx, f"https://w.{DOMAIN}/"),
            "http_other": _curl(sbx, f"http://x.{DOMAIN}/"),
            # Straight at the server's address: no SNI, or a Host that is not allowed.
            "ip_tls": _curl(sbx, f"https://{web.inet.addr}/", "-k"),
            "ip_http": _curl(sbx, f"http://{web.inet.addr}/"),
            # An allowed name whose DNS answer is a private address.
            "private": _curl(sbx, f"http://private.w.{DOMAIN}/"),
            # The proxy judges ports 80 and 443 only: any other port stays closed by CIDR.
            "other_port": _curl(sbx, f"http://api.{DOMAIN}:8080/"),
        }
        assert all(v.startswith("failed") for v in refused.values()), refused
        assert web.hosts() == []  # nothing refused reached a server
        # Each refused by the proxy for its own reason (the other port never reached it).
        grew = {k: v - before.get(k, 0) for k, v in _outcomes(node).items()}
        assert {k: v for k, v in grew.items() if v} == {"not_allowed": 5,
                                                         "address_refused": 1}, grew

        # An allowed SNI aimed at another address still reaches the name's own address.
        out = _curl(sbx, f"https://api.{DOMAIN}/", "--resolve", f"api.{DOMAIN}:443:1.2.3.4")
        assert out == BODY.decode()
        assert web.hosts() == [f"api.{DOMAIN}"]
    finally:
        sbx.kill()


def test_a_live_update_takes_names_away_and_gives_them_back(
        node: NodeProcess, web: Web) -> None:  # fmt: skip
    sbx = _sandbox(web, [f"api.{DOMAIN}"])
    try:
        assert _curl(sbx, f"https://api.{DOMAIN}/") == BODY.decode()
        sbx.update_network({"allow_out": [f"*.{DOMAIN}"], "deny_out": ["0.0.0.0/0"],
                            "dns_servers": [web.inet.addr]})  # fmt: skip
        assert _curl(sbx, f"https://other.{DOMAIN}/") == BODY.decode()
        info = sbx.get_info()
        assert info.network is not None and info.network["allow_out"] == [f"*.{DOMAIN}"]
        sbx.update_network({"deny_out": ["0.0.0.0/0"]})  # no domain: the proxy lets go
        assert _curl(sbx, f"https://other.{DOMAIN}/").startswith("failed")
        sbx.pause()
        sbx.connect()
        assert _curl(sbx, f"https://other.{DOMAIN}/").startswith("failed")
    finally:
        sbx.kill()


def test_the_guest_resolver_is_the_policys_first_dns_server_under_the_same_rules(
        node: NodeProcess, web: Web) -> None:  # fmt: skip
    lookup = f"timeout 3 getent hosts api.{DOMAIN} || echo failed"
    opened = Sandbox.create(timeout=60, network={"dns_servers": [web.inet.addr]})
    closed = Sandbox.create(timeout=60, allow_internet_access=False,
                            network={"dns_servers": [web.inet.addr]})  # fmt: skip
    try:
        assert opened.commands.run("cat /etc/resolv.conf").stdout == "nameserver 169.254.0.22\n"
        assert opened.commands.run(lookup).stdout.split()[0] == web.inet.addr
        assert closed.commands.run(lookup).stdout.strip() == "failed"
    finally:
        opened.kill()
        closed.kill()


@pytest.mark.long  # ~30 s
def test_a_sandbox_reaches_another_by_its_url_through_the_node_and_its_rules(
        node: NodeProcess, web: Web) -> None:  # fmt: skip
    dns = {"dns_servers": [web.inet.addr]}
    served = Sandbox.create(timeout=120)
    tokened = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    opened = Sandbox.create(timeout=120, network=dns)
    closed = Sandbox.create(timeout=120, allow_internet_access=False, network=dns)
    try:
        for target in (served, tokened):
            target.commands.run("cd /tmp && python3 -m http.server 8000", background=True)
            target.commands.run("for i in $(seq 100); do curl -s localhost:8000 >/dev/null "
                                "&& break; sleep 0.2; done")  # fmt: skip
        url = f"http://8000-{served.sandbox_id}.{SBX_DOMAIN}/"
        code = "-o /dev/null -w '%{http_code}'"
        assert _curl(opened, url, code) == "200"
        # The target's own rules apply: its traffic token, as for any client.
        pinned = f"http://8000-{tokened.sandbox_id}.{SBX_DOMAIN}/"
        assert _curl(opened, pinned, code) == "403"
        header = f"-H 'e2b-traffic-access-token: {tokened.traffic_access_token}'"
        assert _curl(opened, pinned, code, header) == "200"
        # The node serves plain HTTP here: no TLS hairpin; no other name on the host.
        assert _curl(opened, url.replace("http:", "https:"), "-k").startswith("failed")
        assert _curl(opened, f"http://api.{SBX_DOMAIN}/health").startswith("failed")
        # A sandbox without public egress has no hairpin either (DNS aside).
        forced = f"--resolve 8000-{served.sandbox_id}.{SBX_DOMAIN}:80:{web.inet.host_addr}"
        assert _curl(closed, url, forced).startswith("failed")
    finally:
        for sbx in (served, tokened, opened, closed):
            sbx.kill()


@pytest.mark.long  # ~30 s
def test_tcp_goes_through_the_egress_proxy_plain_with_credentials_and_over_tls(
        node: NodeProcess, web: Web) -> None:  # fmt: skip
    url = f"http://{web.inet.addr}:{web.peer}/"  # answers with the address it was reached from
    sbx = Sandbox.create(timeout=120, network={
        "egress_proxy": {"address": f"{web.inet.addr}:{web.socks}"}})
    try:
        before = web.dante.connects()
        assert _curl(sbx, url) == web.inet.addr  # Dante's own address, not the slot's
        assert web.dante.connects() == before + 1
        tls = {"address": f"{web.inet.addr}:{web.socks_tls}", "username": USER,
               "password": PASSWORD, "tls": {"server_name": DOMAIN, "ca_cert": web.ca}}
        sbx.update_network({"egress_proxy": tls})
        assert _curl(sbx, url) == web.inet.addr
        info = sbx.get_info().network
        assert info is not None
        assert info["egress_proxy"] == {"address": tls["address"], "username": USER,
                                        "tls": {"server_name": DOMAIN}}  # fmt: skip
        # Credentials that do not pass, or a certificate that does not verify: closed.
        for bad in ({**tls, "password": "wrong"}, {**tls, "tls": True}):
            sbx.update_network({"egress_proxy": bad})
            assert _curl(sbx, url).startswith("failed"), bad
        # Open tunnels follow updates: reset when their proxy changes or their destination
        # closes; left alone, they complete.
        plain = {"egress_proxy": {"address": f"{web.inet.addr}:{web.socks}"}}
        sbx.update_network(plain)
        addr, port = web.inet.addr, web.peer
        assert held_connection(sbx, addr, port) == "got HTTP/1.0 200 OK"
        assert held_connection(sbx, addr, port, lambda: sbx.update_network(
            {"egress_proxy": tls})) == "ECONNRESET"
        assert held_connection(sbx, addr, port, lambda: sbx.update_network(
            {**plain, "deny_out": [addr]})) == "ECONNRESET"
        sbx.update_network({})  # no proxy: direct again, from the slot's address
        before = web.dante.connects()
        assert _curl(sbx, url).startswith("198.18.") and web.dante.connects() == before
    finally:
        sbx.kill()


def test_a_dead_egress_proxy_fails_closed_and_names_go_through_it(
        node: NodeProcess, web: Web) -> None:  # fmt: skip
    url = f"http://{web.inet.addr}:{web.peer}/"
    dead = Sandbox.create(timeout=120, network={
        "egress_proxy": {"address": f"{web.inet.addr}:1099"}})
    named = Sandbox.create(timeout=120, network={
        "allow_out": [f"api.{DOMAIN}"], "deny_out": ["0.0.0.0/0"],
        "dns_servers": [web.inet.addr],
        "egress_proxy": {"address": f"{web.inet.addr}:{web.socks}"}})  # fmt: skip
    try:
        web.peer_hosts()
        assert _curl(dead, url).startswith("failed")
        assert web.peer_hosts() == []  # nothing went out directly
        named.files.write("/tmp/ca.pem", web.ca)
        before = web.dante.connects()
        web.hosts()
        assert _curl(named, f"https://api.{DOMAIN}/") == BODY.decode()
        assert _curl(named, f"https://other.{DOMAIN}/").startswith("failed")
        assert web.hosts() == [f"api.{DOMAIN}"] and web.dante.connects() == before + 1
    finally:
        dead.kill()
        named.kill()


SECRET_VALUE = "sk-test-0f9e8d7c6b5a-never-in-the-guest"
SEEN_MARKER = "aenv-guest-saw-this-4b7d"


def test_a_rule_injects_a_secret_the_guest_never_holds_and_other_tls_is_untouched(
        node: NodeProcess, web: Web) -> None:  # fmt: skip
    Secret.create("test-api-key", SECRET_VALUE)
    auth = {"Authorization": "Bearer " + Secret.fill("test-api-key"), "X-Team": "rl"}
    sbx = Sandbox.create(timeout=120, network={
        "allow_out": [f"api.{DOMAIN}", f"other.{DOMAIN}"], "deny_out": ["0.0.0.0/0"],
        "dns_servers": [web.inet.addr],
        "rules": {f"api.{DOMAIN}": [{"transform": {"headers": auth}}]}})  # fmt: skip
    try:
        sbx.files.write("/tmp/ca.pem", web.ca)
        web.https.requests.clear()
        web.http.requests.clear()
        # The guest trusts the node's CA through its system store (no --cacert), and Python
        # through SSL_CERT_FILE; a header the guest sent for a ruled name is replaced.
        plain = sbx.commands.run(f"curl -sS --max-time 20 -H 'X-Team: guest' "
                                 f"https://api.{DOMAIN}/ || echo failed $?")  # fmt: skip
        assert plain.stdout == BODY.decode()
        py = sbx.commands.run("python3 -c \"import urllib.request as u; print(u.urlopen("
                              f"'https://api.{DOMAIN}/').read().decode(), end='')\"")  # fmt: skip
        assert py.stdout == BODY.decode()
        assert _curl(sbx, f"http://api.{DOMAIN}/") == BODY.decode()  # HTTP too
        seen = web.https.requests + web.http.requests
        assert len(seen) == 3
        assert all(r["authorization"] == f"Bearer {SECRET_VALUE}" and r["x-team"] == "rl"
                   for r in seen), seen  # fmt: skip
        # Another allowed name is not intercepted: the guest sees the server's own
        # certificate (of the test CA, which only /tmp/ca.pem holds), and no header.
        web.https.requests.clear()
        assert _curl(sbx, f"https://other.{DOMAIN}/") == BODY.decode()
        no_ca = sbx.commands.run(f"curl -sS --max-time 20 https://other.{DOMAIN}/ "
                                 "2>/dev/null || echo failed $?").stdout  # fmt: skip
        assert no_ca.startswith("failed")  # the node's CA does not vouch for it
        assert [r.get("authorization") for r in web.https.requests] == [None]
        # The value is nowhere the guest can reach: its processes' environments, its
        # files, its memory (its guest RAM, which does hold what the guest saw).
        sbx.commands.run(f"echo {SEEN_MARKER} > /tmp/seen && cat /tmp/seen")
        envs = sbx.commands.run("cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | "
                                "grep -c sk-test- || true").stdout.strip()  # fmt: skip
        # /usr is the image's, written by nothing at run time; the rest of / read with a
        # cold page cache under TCG can take past the SDK's 60 s.
        files = sbx.commands.run("grep -rl --exclude-dir=proc --exclude-dir=sys "
                                 "--exclude-dir=dev --exclude-dir=usr sk-test-0f9e / "
                                 "2>/dev/null | head -3", timeout=240).stdout.strip()  # fmt: skip
        assert (envs, files) == ("0", "")
        assert sbx.commands.run("echo $SSL_CERT_FILE").stdout.strip() == (
            "/etc/ssl/certs/ca-certificates.crt")
        data = guest_ram(node.env["AENV_INSTANCE"], sbx.sandbox_id)
        assert SEEN_MARKER.encode() in data and SECRET_VALUE.encode() not in data
        # A deleted secret: the request is answered 502 and never sent without it.
        Secret.destroy("test-api-key")
        web.https.requests.clear()
        code = sbx.commands.run(f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 20 "
                                f"https://api.{DOMAIN}/").stdout  # fmt: skip
        assert code == "502" and web.https.requests == []
    finally:
        sbx.kill()
        Secret.destroy("test-api-key")


# Answers every GET with the request's headers, one per line (an httpbin /headers of sorts).
ECHO_HEADERS = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = "".join(f"{k}: {v}\\n" for k, v in self.headers.items()).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("", 8080), H).serve_forever()
"""


def test_a_rule_for_another_sandboxs_url_injects_headers_through_the_hairpin(
        node: NodeProcess, web: Web) -> None:  # fmt: skip
    """The SDK's test_firewall_transform_injects_headers, on this node's plain-HTTP URLs."""
    echo = Sandbox.create(timeout=120)
    try:
        echo.files.write("/tmp/echo.py", ECHO_HEADERS)
        echo.commands.run("python3 /tmp/echo.py", background=True)
        echo.commands.run("for i in $(seq 100); do curl -s localhost:8080 >/dev/null && break; "
                          "sleep 0.2; done")  # fmt: skip
        host = f"8080-{echo.sandbox_id}.{SBX_DOMAIN}"
        sbx = Sandbox.create(timeout=120, network={
            "dns_servers": [web.inet.addr],
            "rules": {host: [{"transform": {"headers": {"X-Test-Token": "transform-123"}}}]}})
        try:
            out = _curl(sbx, f"http://{host}/headers").lower()  # names are case-blind
            assert "x-test-token: transform-123" in out, out
            # Another sandbox URL of the node gets no header.
            other = f"8080-{echo.sandbox_id}x.{SBX_DOMAIN}"
            assert "x-test-token" not in _curl(sbx, f"http://{other}/").lower()
        finally:
            sbx.kill()
    finally:
        echo.kill()


def test_the_host_a_guest_sees_is_masked_and_a_private_port_needs_its_token(
        node: NodeProcess, web: Web) -> None:  # fmt: skip
    """The SDK's test_mask_request_host and test_allow_public_traffic_false/true, through
    this node's data plane from outside (its plain-HTTP URLs)."""
    masked = Sandbox.create(timeout=120, network={
        "mask_request_host": "custom-host.example.com:${PORT}"})
    private = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    try:
        for sbx in (masked, private):
            sbx.files.write("/tmp/echo.py", ECHO_HEADERS)
            sbx.commands.run("python3 /tmp/echo.py", background=True)
            sbx.commands.run("for i in $(seq 100); do curl -s localhost:8080 >/dev/null && "
                             "break; sleep 0.2; done")  # fmt: skip

        def get(sbx: Sandbox, **headers: str) -> httpx.Response:
            host = f"8080-{sbx.sandbox_id}.{SBX_DOMAIN}"
            return httpx.get(node.origin + "/", headers={"Host": host, **headers}, timeout=20)

        r = get(masked)
        assert r.status_code == 200 and "host: custom-host.example.com:8080" in r.text.lower()
        assert get(private).status_code == 403
        token = private.traffic_access_token
        assert token is not None
        r = get(private, **{"e2b-traffic-access-token": token})
        assert r.status_code == 200
        assert "e2b-traffic-access-token" not in r.text.lower()  # never reaches the guest
    finally:
        masked.kill()
        private.kill()
