"""The cluster's links over mutual TLS (issue 33; cluster/links.py): two real nodes (fake
runtime) each with a public listener and a cluster listener, a gateway, a real etcd.
Everything between the gateway and the nodes is captured twice: by a recording relay in
front of each cluster listener and by tcpdump on those listeners' ports; the same captures
over plain links show the secrets, so the search can fail."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509

from aenv.api.app import Node
from aenv.cluster import ca, wire
from aenv.cluster.gateway.app import Gateway
from aenv.cluster.gateway.nodes import NodeLinks
from aenv.cluster.links import Links, LinksRefused, TokenFile, check_plain
from aenv.config import ClusterConfig, Config
from aenv.orchestrator.fake import FakeRuntime
from tests.support.asgi import serve
from tests.support.capture import loopback_capture
from tests.support.etcd import EtcdCluster, free_port

KEY = "links-test-api-key"
TOKEN = "links-test-cluster-token"


@dataclass
class Recorder:
    """A TCP relay to `target` that keeps every byte both ways."""

    target: int
    seen: bytearray = field(default_factory=bytearray)

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            w.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    self.seen += data
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(r, uw), pipe(ur, w))


@contextlib.asynccontextmanager
async def recording(target: int) -> AsyncIterator[tuple[int, Recorder]]:
    rec = Recorder(target)
    server = await asyncio.start_server(rec.handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], rec
    finally:
        server.close()


@dataclass
class Linked:
    nodes: list[Node]
    origin: str  # the gateway's
    links: list[int]  # each node's cluster listener port (behind its recorder)
    publics: list[int]
    captures: list[Recorder]
    gateway_cluster: ClusterConfig


def _certs(tmp: Path) -> Path:
    d = tmp / "ca"
    ca.init(d)
    for name in ("n0", "n1", "gw"):
        ca.issue(d, name, ["127.0.0.1"])
    return d


def _cfg(tmp: Path, etcd: EtcdCluster, prefix: str, cluster: dict[str, Any],
         **kw: Any) -> Config:  # fmt: skip
    return Config.model_validate({
        "data_dir": tmp, "runtime": "fake", "api_key": KEY, "ttl_sweep_interval_s": 0.05,
        "metrics_interval_s": 0.2, "transition_wait_s": 5,
        "cluster": {"etcd_endpoints": etcd.endpoints, "prefix": prefix, "token": TOKEN,
                    "lease_ttl_s": 3, **cluster}, **kw})  # fmt: skip


def _tls(d: Path, name: str) -> dict[str, Any]:
    return {"ca_file": d / "ca.pem", "cert_file": d / f"{name}.pem",
            "key_file": d / f"{name}.key"}


@contextlib.asynccontextmanager
async def linked(tmp: Path, etcd: EtcdCluster, tls: bool, accept: tuple[str, ...] = (),
                 token_files: dict[str, Path] | None = None) -> AsyncIterator[Linked]:  # fmt: skip
    d = _certs(tmp)
    prefix = f"/ln{os.urandom(3).hex()}/"
    async with contextlib.AsyncExitStack() as stack:
        nodes, links, publics, captures = [], [], [], []
        for i in range(2):
            port, link = free_port(), free_port()
            relay, rec = await stack.enter_async_context(recording(link))
            scheme = "https" if tls else "http"
            cluster = {"node_name": f"n{i}", "link_port": link, "accept_tokens": list(accept),
                       **({"token_file": token_files[f"n{i}"]} if token_files else {}),
                       "node_url": f"{scheme}://127.0.0.1:{relay}",
                       **(_tls(d, f"n{i}") if tls else {})}  # fmt: skip
            cfg = _cfg(tmp / f"n{i}", etcd, prefix, cluster, port=port, host="127.0.0.1")
            node = Node(cfg, FakeRuntime())
            await node.start()
            stack.push_async_callback(node.close)
            await stack.enter_async_context(serve(node, port))
            own = Links.of(cfg.cluster)
            opts: dict[str, Any] = {}
            if own is not None:  # the listener's context is reloaded with the rest
                opts = {**own.uvicorn_options(), "tls_to": own.track}
            await stack.enter_async_context(serve(node, link, **opts))
            nodes.append(node)
            links.append(link)
            publics.append(port)
            captures.append(rec)
        gw = Gateway(_cfg(tmp / "gw", etcd, prefix, {
            **(_tls(d, "gw") if tls else {}),
            **({"token_file": token_files["gw"]} if token_files else {})}))
        await gw.start()
        stack.push_async_callback(gw.close)
        gport = await stack.enter_async_context(serve(gw))
        assert gw.members is not None
        for _ in range(100):
            if len(gw.members.nodes) == 2:
                break
            await asyncio.sleep(0.05)
        yield Linked(nodes, f"http://127.0.0.1:{gport}", links, publics, captures,
                     gw.config.cluster)


async def _traffic(c: Linked) -> list[str]:
    """Creates, reads, a listing and kills through the gateway; the access tokens."""
    tokens = []
    async with httpx.AsyncClient(base_url=c.origin, headers={"X-API-Key": KEY},
                                 timeout=30) as api:  # fmt: skip
        made = []
        for _ in range(4):
            r = await api.post("/sandboxes", json={"templateID": "base", "secure": True,
                                                    "envVars": {"SECRET_ENV": "envsecret"}})
            assert r.status_code == 201, r.text
            made.append(r.json())
            tokens.append(r.json()["envdAccessToken"])
        assert {n.orchestrator.store.get(s["sandboxID"]) is not None
                for n in c.nodes for s in made} == {True, False}  # on both nodes
        assert len((await api.get("/v2/sandboxes")).json()) == 4
        for s in made:
            assert (await api.get(f"/sandboxes/{s['sandboxID']}")).status_code == 200
            assert (await api.delete(f"/sandboxes/{s['sandboxID']}")).status_code == 204
    return tokens


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
async def test_what_crosses_the_links_is_encrypted(tmp_path: Path, one: EtcdCluster,
                                                   tls: bool) -> None:  # fmt: skip
    async with linked(tmp_path, one, tls) as c:
        with loopback_capture(tmp_path, c.links) as pcap:  # tcpdump on the nodes' listeners
            tokens = await _traffic(c)
        relayed = bytes(c.captures[0].seen + c.captures[1].seen)
        dumped = pcap.read_bytes()
        assert len(relayed) > 2000 and len(dumped) > 2000  # the links carried the traffic
        captured = relayed + dumped
        secrets = [KEY, TOKEN, "envsecret", *tokens]
        found = [s for s in secrets if s.encode() in captured]
        if tls:
            assert found == [], f"in the clear on the links: {found}"
        else:  # the same search finds them in plain links, in tcpdump's capture too
            assert KEY in found and TOKEN in found, found
            assert KEY.encode() in dumped and TOKEN.encode() in dumped


async def test_the_cluster_token_alone_lets_nobody_in(tmp_path: Path, one: EtcdCluster) -> None:
    async with linked(tmp_path, one, True) as c:
        d = tmp_path / "ca"
        token = {wire.TOKEN_HEADER: TOKEN}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{c.publics[0]}",
                                     headers={"X-API-Key": KEY}) as public:  # fmt: skip
            # the public port: the token is nobody's
            r = await public.post("/sandboxes", json={"templateID": "base"},
                                  headers={**token, wire.SANDBOX_ID_HEADER: "x" * 20})
            assert r.status_code == 403, r.text
            r = await public.get(f"{wire.INTERNAL_PREFIX}/published", headers=token)
            assert r.status_code == 404
        link = f"https://127.0.0.1:{c.links[0]}"
        # the cluster listener: no certificate, then one of another CA, are refused in TLS
        for cert in (None, "other"):
            ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
            if cert:
                ca.init(tmp_path / "other")
                pair = ca.issue(tmp_path / "other", "intruder", ["127.0.0.1"])
                ctx.load_cert_chain(*map(str, pair))
            async with httpx.AsyncClient(verify=ctx) as h:
                with pytest.raises((httpx.ConnectError, httpx.ReadError,
                                    httpx.RemoteProtocolError)):  # fmt: skip
                    await h.get(link + "/health", headers=token)
        # with the cluster's certificate it answers
        async with httpx.AsyncClient(verify=Links.of(ClusterConfig(
                **_tls(d, "gw"))).client()) as h:  # type: ignore[union-attr]  # fmt: skip
            assert (await h.get(link + "/health")).status_code == 200


async def test_a_gateway_without_certificates_does_not_reach_tls_nodes(
    tmp_path: Path, one: EtcdCluster
) -> None:
    async with linked(tmp_path, one, True) as c:
        prefix = c.nodes[0].config.cluster.prefix
        gw = Gateway(_cfg(tmp_path / "gw2", one, prefix, {}))
        await gw.start()
        try:
            async with serve(gw) as port, httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{port}", headers={"X-API-Key": KEY}) as api:
                for _ in range(100):
                    if gw.members is not None and len(gw.members.nodes) == 2:
                        break
                    await asyncio.sleep(0.05)
                r = await api.post("/sandboxes", json={"templateID": "base"})
                assert r.status_code in (502, 503), r.text
        finally:
            await gw.close()
        assert all(not n.orchestrator.store.all() for n in c.nodes)


def test_plain_links_off_this_host_and_bad_certificates_are_refused(tmp_path: Path) -> None:
    plain = ClusterConfig()
    check_plain(plain, "http://127.0.0.1:8001", "node")  # loopback: fine
    with pytest.raises(LinksRefused, match="plain HTTP off this host"):
        check_plain(plain, "http://10.1.2.3:8001", "this node's cluster URL")
    check_plain(ClusterConfig(insecure_links=True), "http://10.1.2.3:8001", "node")
    with pytest.raises(ValueError, match="plain HTTP off this host"):
        NodeLinks(None).address("http://10.1.2.3:8001")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs cluster.ca_file"):
        NodeLinks(None).address("https://10.1.2.3:8001")  # type: ignore[arg-type]
    d = _certs(tmp_path)
    wrong = Links(d / "ca.pem", d / "n0.pem", d / "n1.key")
    with pytest.raises(LinksRefused, match="do not load as a pair"):
        wrong.server()
    with pytest.raises(LinksRefused, match="not a readable file"):
        Links(d / "nope.pem", d / "n0.pem", d / "n0.key").client()


async def _creates_and_kills(origin: str, stop: asyncio.Event, failures: list[str]) -> int:
    """Creates and kills through the gateway until `stop`; each refusal in `failures`."""
    n = 0
    async with httpx.AsyncClient(base_url=origin, headers={"X-API-Key": KEY},
                                 timeout=30) as api:  # fmt: skip
        while not stop.is_set():
            r = await api.post("/sandboxes", json={"templateID": "base"})
            if r.status_code != 201:
                failures.append(r.text)
                continue
            r = await api.delete(f"/sandboxes/{r.json()['sandboxID']}")
            if r.status_code != 204:
                failures.append(r.text)
            n += 1
    return n


def _served(port: int, ctx: ssl.SSLContext) -> x509.Certificate:
    """The certificate a new handshake with the listener on `port` shows."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:  # fmt: skip
        der = s.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


async def test_certificates_rotate_under_traffic_without_a_restart(
    tmp_path: Path, one: EtcdCluster
) -> None:
    """A new CA joins the bundle, then every member's certificate is replaced by one the new
    CA signed, while requests go through the gateway: none fails, and new handshakes show
    the new certificates (Links.reload, what `watch` calls when the files change)."""
    async with linked(tmp_path, one, True) as c:
        d = tmp_path / "ca"
        gw_links = Links.of(ClusterConfig(**_tls(d, "gw")))
        assert gw_links is not None
        probe = gw_links.client()
        before = await asyncio.to_thread(_served, c.links[0], probe)
        failures: list[str] = []
        stop = asyncio.Event()
        load = asyncio.create_task(_creates_and_kills(c.origin, stop, failures))
        await asyncio.sleep(0.5)
        # 1. the new CA next to the old one in every member's CA file
        ca.init(tmp_path / "ca2", name="aenv cluster CA 2")
        bundle = (d / "ca.pem").read_text() + (tmp_path / "ca2" / "ca.pem").read_text()
        (d / "ca.pem").write_text(bundle)
        assert gw_links.reload() and all(Links.of(n.config.cluster).reload()  # type: ignore[union-attr]
                                         for n in c.nodes)  # fmt: skip
        await asyncio.sleep(0.5)
        # 2. each member's certificate from the new CA, one after the other
        for name in ("n0", "n1", "gw"):
            cert, key = ca.issue(tmp_path / "ca2", name, ["127.0.0.1"])
            (d / f"{name}.pem").write_bytes(cert.read_bytes())
            (d / f"{name}.key").write_bytes(key.read_bytes())
        for links in {gw_links, *(Links.of(n.config.cluster) for n in c.nodes)}:
            assert links is not None and links.reload()
        await asyncio.sleep(0.5)
        stop.set()
        done = await load
        assert failures == [] and done > 5, (failures, done)
        after = await asyncio.to_thread(_served, c.links[0], probe)
        assert after.serial_number != before.serial_number
        new_ca = x509.load_pem_x509_certificate((tmp_path / "ca2" / "ca.pem").read_bytes())
        assert after.issuer == new_ca.subject != before.issuer



async def test_a_token_rotation_takes_the_next_token_beside_the_current(
    tmp_path: Path, one: EtcdCluster
) -> None:
    """Nodes that take `accept_tokens` beside their own: a gateway already on the next
    token is served; one with a token no node takes is not."""
    async with linked(tmp_path, one, True, accept=("next-token",)) as c:
        prefix = c.nodes[0].config.cluster.prefix
        for token, ok in (("next-token", True), ("bogus-token", False)):
            gw = Gateway(_cfg(tmp_path / f"gw-{token}", one, prefix,
                              {**_tls(tmp_path / "ca", "gw"), "token": token}))  # fmt: skip
            await gw.start()
            try:
                async with serve(gw) as port, httpx.AsyncClient(
                        base_url=f"http://127.0.0.1:{port}", headers={"X-API-Key": KEY},
                        timeout=30) as api:  # fmt: skip
                    for _ in range(100):
                        if gw.members is not None and len(gw.members.nodes) == 2:
                            break
                        await asyncio.sleep(0.05)
                    r = await api.post("/sandboxes", json={"templateID": "base"})
                    assert (r.status_code == 201) == ok, r.text
                    if ok:
                        await api.delete(f"/sandboxes/{r.json()['sandboxID']}")
            finally:
                await gw.close()


async def test_a_token_file_rotates_the_token_under_traffic_without_a_restart(
    tmp_path: Path, one: EtcdCluster
) -> None:
    """Every member reads the token from a file (`cluster.token_file`) and takes it again
    when it changes: the next token added as a second line everywhere, then made the first,
    then the old one dropped, while creates and kills go through the gateway. None fails;
    at the end the old token lets nobody in and the new one does."""
    files = {n: tmp_path / f"token-{n}" for n in ("n0", "n1", "gw")}
    for f in files.values():
        f.write_text(f"{TOKEN}\n")
    async with linked(tmp_path, one, True, token_files=files) as c:
        failures: list[str] = []
        stop = asyncio.Event()
        load = asyncio.create_task(_creates_and_kills(c.origin, stop, failures))
        watchers = [TokenFile(n.config.cluster) for n in c.nodes] + [TokenFile(c.gateway_cluster)]
        for step in (f"{TOKEN}\nnext-token\n", f"next-token\n{TOKEN}\n", "next-token\n"):
            await asyncio.sleep(0.4)
            for name in ("n0", "n1", "gw"):  # one member after the other
                files[name].write_text(step)
                os.utime(files[name], (time.time() + 1, time.time() + 1))  # a new mtime
                for w in watchers:
                    w.apply()
                await asyncio.sleep(0.2)
        await asyncio.sleep(0.4)
        stop.set()
        done = await load
        assert failures == [] and done > 5, (failures, done)
        assert all(n.config.cluster.tokens_taken() == ["next-token"] for n in c.nodes)
        async with httpx.AsyncClient(verify=Links.of(ClusterConfig(
                **_tls(tmp_path / "ca", "gw"))).client()) as h:  # type: ignore[union-attr]  # fmt: skip
            url = f"https://127.0.0.1:{c.links[0]}/sandboxes"
            placed = {"X-API-Key": KEY, wire.SANDBOX_ID_HEADER: "rotated0sandbox0id00"}
            r = await h.post(url, json={"templateID": "base"},
                             headers={**placed, wire.TOKEN_HEADER: TOKEN})  # fmt: skip
            assert r.status_code == 403, r.text  # the old token: nobody's now
            r = await h.post(url, json={"templateID": "base"},
                             headers={**placed, wire.TOKEN_HEADER: "next-token"})  # fmt: skip
            assert r.status_code == 201, r.text
            await h.delete(f"{url}/rotated0sandbox0id00", headers={"X-API-Key": KEY})
