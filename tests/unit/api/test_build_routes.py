"""Which route wins: the build API's `/templates/{id}/files|builds|tags` routes come before
the catch-all `/templates/{id:path}` ones (get a template, delete a snapshot, whose names
may hold `/`). On a node without VMs (the fake runtime) the build API says it builds
nothing, in E2B's error shape; the real flow is tests/e2e/test_template_build.py."""

from __future__ import annotations

import httpx

H = "ab" * 32
NO_BUILDS = "builds no templates"


async def test_build_routes_are_not_swallowed_by_the_catch_all(client: httpx.AsyncClient) -> None:
    for method, path in [
        ("GET", f"/templates/base/files/{H}"),
        ("GET", "/templates/base/builds/0b9a3c1e-0000-4000-8000-000000000000/status"),
        ("DELETE", "/templates/base/builds/0b9a3c1e-0000-4000-8000-000000000000"),
        ("GET", "/templates/base/tags"),
        ("POST", "/v3/templates"),
        ("POST", "/templates/tags"),
    ]:
        body = {"name": "x"} if method == "POST" and path == "/v3/templates" else (
            {"target": "base", "tags": ["t"]} if method == "POST" else None)
        r = await client.request(method, path, json=body)
        assert r.status_code == 400, (path, r.text)
        assert r.json()["code"] == 400 and NO_BUILDS in r.json()["message"], (path, r.text)


async def test_the_catch_all_routes_still_take_the_rest(client: httpx.AsyncClient) -> None:
    r = await client.get("/templates/base")
    assert r.status_code == 200 and r.json()["templateID"] == "base"
    r = await client.delete("/templates/team/a-snapshot/name")  # snapshot names may hold /
    assert r.status_code == 404 and "team/a-snapshot/name" in r.json()["message"]


async def test_uploads_need_a_node_that_builds(client: httpx.AsyncClient) -> None:
    r = await client.put(f"/_aenv/build-files/{H}?exp=1&sig=x", content=b"data",
                         headers={"X-API-Key": ""})  # fmt: skip
    assert r.status_code == 404 and r.json()["code"] == 404
