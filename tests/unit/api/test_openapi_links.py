"""The served OpenAPI document: an operationId on every operation, and links that resolve."""

from __future__ import annotations

import httpx
import pytest

from aenv.api import links


async def test_every_operation_has_a_unique_operation_id(client: httpx.AsyncClient) -> None:
    doc = (await client.get("/openapi.json")).json()
    ids = [op.get("operationId") for item in doc["paths"].values() for op in item.values()]
    assert None not in ids and len(ids) == len(set(ids)) >= 20, ids


async def test_links_point_at_operations_with_the_parameters_they_fill(
    client: httpx.AsyncClient,
) -> None:
    doc = (await client.get("/openapi.json")).json()
    ops = {op["operationId"]: op for item in doc["paths"].values() for op in item.values()}
    seen = 0
    for source, op in ops.items():
        for resp in op["responses"].values():
            for link in resp.get("links", {}).values():
                target = ops[link["operationId"]]
                params = {f"{p['in']}.{p['name']}" for p in target.get("parameters", [])}
                assert set(link.get("parameters", {})) <= params, (source, link)
                seen += 1
    assert seen >= 50
    # a create leads to the operations on the sandbox it made
    create = ops["createSandboxV2"]["responses"]["201"]["links"]
    assert {"getSandbox", "killSandbox", "pauseSandbox", "forkSandbox"} <= set(create)


def test_a_link_to_an_unknown_operation_is_refused() -> None:
    doc = {"paths": {"/x": {"get": {"operationId": "createSandboxV2", "responses": {}}}}}
    with pytest.raises(ValueError, match="unknown"):
        links.add_links(doc)
