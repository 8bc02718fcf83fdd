"""allow_internet_access and network.allowOut/denyOut over HTTP (fake runtime): what is
refused, the node's default, that the policy reaches the runtime on create, resume and fork
and survives a node restart, and live updates (PUT /sandboxes/{id}/network, through the
SDK's generated client). The policy's effect on packets is tested on real VMs
(tests/integration/network/test_isolation.py, tests/e2e/test_network_update.py)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import httpx
import pytest
from e2b.api.client.api.sandboxes import put_sandboxes_sandbox_id_network
from e2b.api.client.client import AuthenticatedClient
from e2b.api.client.models import SandboxNetworkUpdateConfig
from e2b.api.client.types import Response

from aenv.api.app import Node
from aenv.network.egress import EgressPolicy
from aenv.orchestrator.fake import FakeRuntime

from .conftest import KEY, make_config
from .test_control_plane import assert_error, create

Net = ipaddress.IPv4Network


@pytest.mark.parametrize(("network", "text"), [
    ({"allowOut": ["*"]}, "bare wildcard"),
    ({"allowOut": ["ex ample.com"]}, "not an IPv4 address, a CIDR, a hostname"),
    ({"allowOut": ["a.*.example.com"]}, "not an IPv4 address, a CIDR, a hostname"),
    ({"allowOut": ["-a.example.com"]}, "not an IPv4 address, a CIDR, a hostname"),
    ({"denyOut": ["example.com"]}, "domains are allowed in allowOut only"),
    ({"denyOut": ["2001:db8::/32"]}, "IPv6"),
    ({"allowOut": "10.0.0.1"}, "allowOut"),
    ({"allowOut": [1]}, "allowOut"),
    ({"allowOut": ["10.0.0.0/33"]}, "not an IPv4"),
    ({"dnsServers": ["1.1.1.1", "example.com"]}, "dnsServers: 'example.com' is not an IPv4"),
    ({"dnsServers": [f"10.0.0.{i}" for i in range(11)]}, "more than 10"),
    ({"egressProxy": {"address": "nowhere.invalid:1080"}}, "'nowhere.invalid' does not resolve"),
    ({"egressProxy": {"address": "127.0.0.1:1080"}}, "an internal address"),
    ({"egressProxy": {"address": "10.0.0.1:1080"}}, "an internal address"),
    ({"egressProxy": {"address": "1.2.3.4"}}, "is not host:port"),
    ({"egressProxy": {"address": "1.2.3.4:0"}}, "is not host:port"),
    ({"egressProxy": {"address": "[2001:db8::1]:1080"}}, "IPv6"),
    ({"egressProxy": "1.2.3.4:1080"}, "egressProxy"),
    ({"egressProxy": {"address": "1.2.3.4:1080", "password": "pw"}}, "needs a username"),
    ({"egressProxy": {"address": "1.2.3.4:1080", "username": "u" * 256}}, "1 to 255 bytes"),
    ({"egressProxy": {"address": "1.2.3.4:1080", "tls": {"enabled": False,
                                                        "serverName": "p"}}}, "no other field"),
    ({"egressProxy": {"address": "1.2.3.4:1080", "tls": {"caCert": "nope"}}}, "no PEM"),
    ({"rules": {"api.example.com": [{"transform": {"headers": {
        "Authorization": "Bearer ${e2b.secrets.missing}"}}}]}}, "secret 'missing' does not exist"),
    ({"rules": {"api.example.com": [{"transform": {"headers": {
        "Authorization": "${e2b.identity.tokens.aws}"}}}]}}, "workload identity"),
    ({"rules": {"1.2.3.4": [{"transform": {"headers": {"a": "b"}}}]}}, "rules are by domain"),
    ({"rules": {"api.example.com": [{"transform": {"headers": {"Host": "x"}}}]}},
     "not a header a rule may set"),
    ({"rules": {"api.example.com": [{"transform": {"headers": {"a": "b\r\nc: d"}}}]}},
     "single-line"),
    ({"rules": {"api.example.com": [{"transform": {"body": "x"}}]}}, "headers only"),
    ({"rules": {"api.example.com": {"transform": {}}}}, "must be a list"),
])
async def test_network_options_it_cannot_enforce_are_400(
    client: httpx.AsyncClient, node: Node, network: dict, text: str
) -> None:
    r = await client.post("/v2/sandboxes", json={"templateID": "base", "network": network})
    assert_error(r, 400, text)
    assert node.orchestrator.store.all() == []


async def test_policy_reaches_every_start_of_the_sandbox(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    sb = await create(client, allow_internet_access=False, network={
        "allowOut": ["203.0.113.7", "10.1.2.0/24"], "denyOut": ["0.0.0.0/0"],
        "allowPublicTraffic": False})  # an unset-like value of another key is fine
    sid = sb["sandboxID"]
    want = EgressPolicy(allow_out=(Net("10.1.2.0/24"), Net("203.0.113.7/32")),
                        deny_out=(Net("0.0.0.0/0"),), internet=False)
    assert runtime.inits[sid].egress == want
    assert (await client.get(f"/sandboxes/{sid}")).json()["allowInternetAccess"] is False
    assert (await client.post(f"/sandboxes/{sid}/pause")).status_code == 204
    runtime.inits.pop(sid)
    assert (await client.post(f"/sandboxes/{sid}/connect", json={})).status_code == 201
    assert runtime.inits[sid].egress == want  # a resume applies it again
    r = await client.post(f"/sandboxes/{sid}/fork", json={"count": 1})
    kid = r.json()[0]["sandbox"]["sandboxID"]
    assert runtime.inits[kid].egress == want  # children inherit it


async def test_an_egress_proxy_is_kept_and_reported_without_its_secrets(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    proxy = {"address": "1.2.3.4:1080", "username": "u", "password": "pw",
             "tls": {"enabled": True, "serverName": "socks.example.com"}}  # fmt: skip
    sid = (await create(client, network={"egressProxy": proxy}))["sandboxID"]
    p = runtime.inits[sid].egress.egress_proxy
    assert p is not None
    assert (p.host, p.port, p.username, p.password) == ("1.2.3.4", 1080, "u", "pw")
    assert p.tls and p.server_name == "socks.example.com"
    got = (await client.get(f"/sandboxes/{sid}")).json()["network"]["egressProxy"]
    assert got == {"address": "1.2.3.4:1080", "username": "u",  # never the password or CA
                   "tls": {"enabled": True, "serverName": "socks.example.com"}}
    r = await client.put(f"/sandboxes/{sid}/network", json={})  # an update replaces it
    assert r.status_code == 204 and runtime.egress[sid].egress_proxy is None
    assert "egressProxy" not in (await client.get(f"/sandboxes/{sid}")).json()["network"]


async def test_rules_are_kept_and_reported_with_placeholders_only(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    r = await client.post("/secrets", json={"name": "key", "value": "s3cr3t-value"})
    assert r.status_code == 201
    rules = {"api.example.com": [{"transform": {"headers": {
        "Authorization": "Bearer ${e2b.secrets.key}"}}}]}  # fmt: skip
    sid = (await create(client, network={"allowOut": ["api.example.com"], "rules": rules}))[
        "sandboxID"]
    (rule,) = runtime.inits[sid].egress.rules
    assert rule.pattern == "api.example.com" and rule.secret_names() == {"key"}
    got = (await client.get(f"/sandboxes/{sid}")).text
    assert "${e2b.secrets.key}" in got and "s3cr3t-value" not in got
    assert (await client.put(f"/sandboxes/{sid}/network", json={})).status_code == 204
    assert runtime.egress[sid].rules == ()  # an update replaces them


async def test_domains_are_kept_normalised_reported_and_inherited(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    sb = await create(client, network={
        "allowOut": ["API.Example.com.", "*.example.org", "198.51.100.9"],
        "denyOut": ["0.0.0.0/0"], "dnsServers": ["198.51.100.53"]})  # fmt: skip
    sid = sb["sandboxID"]
    egress = runtime.inits[sid].egress
    assert egress.domains == ("*.example.org", "api.example.com")
    assert egress.resolvers == ("198.51.100.53",)
    net = (await client.get(f"/sandboxes/{sid}")).json()["network"]
    assert net["allowOut"] == ["198.51.100.9/32", "*.example.org", "api.example.com"]
    r = await client.post(f"/sandboxes/{sid}/fork", json={"count": 1})
    kid = r.json()[0]["sandbox"]["sandboxID"]
    assert runtime.inits[kid].egress == egress
    # Without dnsServers, E2B's default resolver serves the domains.
    assert EgressPolicy.from_request(False, ["example.com"]).resolvers == ("8.8.8.8",)


async def test_public_destinations_are_open_by_default_as_in_e2b(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    opened = await create(client)
    assert runtime.inits[opened["sandboxID"]].egress == EgressPolicy(internet=True)
    closed = await create(client, allow_internet_access=False)
    assert runtime.inits[closed["sandboxID"]].egress.is_closed
    detail = (await client.get(f"/sandboxes/{opened['sandboxID']}")).json()
    assert detail["allowInternetAccess"] is None
    assert detail["network"] == {"allowOut": [], "denyOut": [], "allowPublicTraffic": True}


async def test_a_node_may_close_them_by_default(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    node = Node(make_config(tmp_path, network={"internet_by_default": False}), runtime)
    await node.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=node),
                                     base_url="http://aenv", headers={"X-API-Key": KEY}) as c:
            closed = await create(c)
            assert runtime.inits[closed["sandboxID"]].egress.is_closed
            opened = await create(c, allow_internet_access=True)
            assert runtime.inits[opened["sandboxID"]].egress == EgressPolicy(internet=True)
    finally:
        await node.close()


async def test_policy_survives_a_node_restart(tmp_path: Path) -> None:
    config = make_config(tmp_path, on_shutdown="pause")
    runtime = FakeRuntime()
    node = Node(config, runtime)
    await node.start()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=node),
                                 base_url="http://aenv", headers={"X-API-Key": KEY}) as c:
        sid = (await create(c, network={"allowOut": ["198.51.100.0/24"]}))["sandboxID"]
        assert (await c.post(f"/sandboxes/{sid}/pause")).status_code == 204
    await node.close()
    node = Node(config, runtime)
    await node.start()
    try:
        rec = node.orchestrator.get(sid)
        assert rec.egress == EgressPolicy(allow_out=(Net("198.51.100.0/24"),), internet=True)
    finally:
        await node.close()



async def _update(sdk: AuthenticatedClient, sid: str, **body: object) -> Response[object]:
    return await put_sandboxes_sandbox_id_network.asyncio_detailed(
        sid, client=sdk, body=SandboxNetworkUpdateConfig(**body))  # type: ignore[arg-type]


async def test_an_update_replaces_the_policy_live_and_omitted_fields_are_cleared(
    client: httpx.AsyncClient, sdk: AuthenticatedClient, runtime: FakeRuntime
) -> None:
    sid = (await create(client, network={"allowOut": ["203.0.113.7"],
                                         "denyOut": ["0.0.0.0/0"]}))["sandboxID"]  # fmt: skip
    r = await _update(sdk, sid, deny_out=["8.8.8.8"], dns_servers=["1.1.1.1"])
    assert r.status_code == 204, r.content
    want = EgressPolicy(deny_out=(Net("8.8.8.8/32"),), internet=True, dns_servers=("1.1.1.1",))
    assert runtime.egress[sid] == want  # on the slot at once
    detail = (await client.get(f"/sandboxes/{sid}")).json()
    assert detail["network"] == {"allowOut": [], "denyOut": ["8.8.8.8/32"],
                                 "dnsServers": ["1.1.1.1"], "allowPublicTraffic": True}

    assert (await _update(sdk, sid)).status_code == 204  # {}: everything back to default
    assert runtime.egress[sid] == EgressPolicy(internet=True)
    assert (await _update(sdk, sid, allow_internet_access=False)).status_code == 204
    assert runtime.egress[sid].is_closed
    assert (await client.get(f"/sandboxes/{sid}")).json()["allowInternetAccess"] is False

    # Forks inherit the updated policy.
    r = await client.post(f"/sandboxes/{sid}/fork", json={"count": 1})
    kid = r.json()[0]["sandbox"]["sandboxID"]
    assert runtime.inits[kid].egress == EgressPolicy(internet=False)


async def test_a_paused_sandbox_gets_its_update_at_resume(
    client: httpx.AsyncClient, sdk: AuthenticatedClient, runtime: FakeRuntime
) -> None:
    sid = (await create(client))["sandboxID"]
    assert (await client.post(f"/sandboxes/{sid}/pause")).status_code == 204
    r = await _update(sdk, sid, allow_out=["198.51.100.0/24"], deny_out=["0.0.0.0/0"])
    assert r.status_code == 204, r.content
    assert sid not in runtime.egress  # no slot while paused
    assert (await client.post(f"/sandboxes/{sid}/connect", json={})).status_code == 201
    assert runtime.inits[sid].egress == EgressPolicy(
        allow_out=(Net("198.51.100.0/24"),), deny_out=(Net("0.0.0.0/0"),), internet=True)


async def test_bad_updates_are_clear_errors_and_change_nothing(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    sid = (await create(client, allow_internet_access=False))["sandboxID"]
    for body, status, text in [
        ({"allowOut": ["*.*"]}, 400, "allowOut"),
        ({"denyOut": ["*.example.com"]}, 400, "domains are allowed in allowOut only"),
        ({"denyOut": "8.8.8.8"}, 400, "denyOut"),
        ({"dnsServers": ["nope"]}, 400, "dnsServers"),
        ({"egressProxy": {"address": "nowhere.invalid:1080"}}, 400, "does not resolve"),
        ({"rules": {"a.example.com": [{"transform": {"headers": {
            "a": "${e2b.secrets.nope}"}}}]}}, 400, "secret 'nope' does not exist"),
        ({"allowInternetAccess": "yes"}, 400, "allowInternetAccess"),
    ]:
        assert_error(await client.put(f"/sandboxes/{sid}/network", json=body), status, text)
    assert_error(await client.put("/sandboxes/nope/network", json={}), 404)
    assert_error(await client.put(f"/sandboxes/{sid}/network", content=b"[1"), 400)
    assert sid not in runtime.egress
    assert (await client.get(f"/sandboxes/{sid}")).json()["allowInternetAccess"] is False
