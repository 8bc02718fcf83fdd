"""The SandboxFusion endpoint's credential and its answers to bad requests, on an
in-process node (no VMs). Programs run in real VMs in tests/e2e/test_rl_run_code.py."""

from __future__ import annotations

import logging

import httpx
import pytest

from aenv.api.app import Node
from aenv.rl.server.run_code import Tokens


def _as(node: Node, key: str | None) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=node), base_url="http://aenv",
                             headers={"X-API-Key": key} if key else {})  # fmt: skip


async def test_a_token_is_bound_to_its_key_and_dies_with_it(
        node: Node, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    await client.post("/admin/teams", json={"name": "red"})
    r = await client.post("/admin/keys", json={"team": "red", "name": "trainer"})
    red_key, red_key_id = r.json()["key"], r.json()["keyID"]
    async with _as(node, red_key) as red:
        r = await red.get("/rl/run_code")
        assert r.status_code == 200, r.text
        got = r.json()
    token = got["path"].rpartition("/")[2]
    assert got["url"] == "http://aenv" + got["path"] and "python" in got["languages"]
    assert red_key not in token  # the token is not the key, and it names no secret
    bad = {"code": "print(1)", "language": "cobol"}
    caplog.set_level(logging.DEBUG)
    async with _as(node, None) as anon:  # verl's client sends no API key
        # A token of this node's is accepted (the language is refused in SandboxFusion's
        # words: HTTP 200, SandboxError).
        r = await anon.post(got["path"], json=bad)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "SandboxError" and "cobol" in r.json()["message"]
        forged = [token[:-1] + ("0" if token[-1] != "0" else "1"),  # another mac
                  token.replace(red_key_id, "k_other"), "sf1.x", "nonsense"]
        for t in forged:
            r = await anon.post(f"/rl/run_code/{t}", json=bad)
            assert r.json() == {"code": 401, "message": "invalid run-code token"}, t
        # Revoking the key revokes the token.
        assert (await client.delete(f"/admin/keys/{red_key_id}")).status_code in (200, 204)
        r = await anon.post(got["path"], json=bad)
        assert r.status_code == 401
    # Another node's secrets key makes other tokens.
    other = Tokens(lambda: b"another node's key")
    assert other.key_id(token) is None and other.key_id(other.make(red_key_id)) == red_key_id
    node_logs = [r.getMessage() + repr(r.__dict__.get("kv"))
                 for r in caplog.records if r.name.startswith("aenv")]  # fmt: skip
    assert node_logs and not [m for m in node_logs if token in m]


async def test_bad_bodies_get_sandbox_fusions_answer(client: httpx.AsyncClient) -> None:
    path = (await client.get("/rl/run_code")).json()["path"]
    for body, words in (
        ([1, 2], "bad request"),
        ({"language": "python"}, "code"),
        ({"code": "x", "run_timeout": -1}, "run_timeout"),
        ({"code": "x", "files": {"a.txt": "%%%"}}, "not base64"),
    ):
        r = await client.post(path, json=body)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["status"] == "SandboxError" and words in doc["message"], (body, doc)
        assert doc["run_result"] is None and doc["files"] == {}
    r = await client.post(path, content=b"not json", headers={"Content-Type": "text/plain"})
    assert r.status_code == 200 and r.json()["status"] == "SandboxError"


async def test_the_nodes_own_group_keys_are_reserved(client: httpx.AsyncClient) -> None:
    r = await client.post("/rl/groups", json={"key": "aenv/run_code",
                                              "source": {"template": "base"}})  # fmt: skip
    assert r.status_code == 400 and "reserved" in r.json()["message"]
