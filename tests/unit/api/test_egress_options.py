"""allow_internet_access and network.allowOut/denyOut over HTTP (fake runtime): what is
refused, and that the policy reaches the runtime on create, resume and fork, and survives a
node restart. The policy's effect on packets is tested on real VMs
(tests/integration/network/test_isolation.py)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import httpx
import pytest

from aenv.api.app import Node
from aenv.network.egress import EgressPolicy
from aenv.orchestrator.fake import FakeRuntime

from .conftest import KEY, make_config
from .test_control_plane import assert_error, create

Net = ipaddress.IPv4Network


@pytest.mark.parametrize(("network", "text"), [
    ({"allowOut": ["example.com"]}, "domain names are not supported"),
    ({"denyOut": ["2001:db8::/32"]}, "IPv6"),
    ({"allowOut": "10.0.0.1"}, "allowOut"),
    ({"allowOut": [1]}, "allowOut"),
    ({"allowOut": ["10.0.0.0/33"]}, "not an IPv4"),
    ({"dnsServers": ["1.1.1.1"]}, "network.dnsServers is not supported"),
    ({"egressProxy": {"address": "p:1080"}}, "network.egressProxy"),
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


async def test_default_is_closed_and_true_opens_the_internet(
    client: httpx.AsyncClient, runtime: FakeRuntime
) -> None:
    closed = await create(client)
    assert runtime.inits[closed["sandboxID"]].egress.is_closed
    opened = await create(client, allow_internet_access=True)
    assert runtime.inits[opened["sandboxID"]].egress == EgressPolicy(internet=True)


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
        assert rec.egress == EgressPolicy(allow_out=(Net("198.51.100.0/24"),))
    finally:
        await node.close()
