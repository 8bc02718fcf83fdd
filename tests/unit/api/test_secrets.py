"""The secrets API through the unmodified SDK (`e2b.AsyncSecret`) on a real HTTP server:
values are write-only, versioned and encrypted at rest; names and ids both find a secret."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSecret, SecretException

from aenv.api.app import Node
from aenv.secrets.vault import key_path, load_key
from aenv.teams.model import DEFAULT_TEAM

from .conftest import KEY, serve
from .test_control_plane import assert_error

VALUE = "sk-live-do-not-print-4d1f"


async def test_create_read_version_list_and_delete_through_the_sdk(node: Node) -> None:
    async with serve(node) as port:
        opts = {"api_key": KEY, "api_url": f"http://127.0.0.1:{port}"}
        info = await AsyncSecret.create("OpenAI-Key", VALUE, {"team": "rl"}, **opts)
        assert info.name == "openai-key" and info.version == 1  # names are lower-cased
        assert info.secret_id.startswith("sec_") and info.metadata == {"team": "rl"}
        for ref in (info.secret_id, "openai-key", "OPENAI-KEY"):
            assert (await AsyncSecret.get_info(ref, **opts)).secret_id == info.secret_id
        new = await AsyncSecret.update("openai-key", VALUE + "-2", **opts)
        assert new.version == 2 and new.metadata == {"team": "rl"}  # kept unless given
        assert new.updated_at >= info.updated_at
        store = node.orchestrator.secrets
        assert store is not None and await store.value(DEFAULT_TEAM, "openai-key") == VALUE + "-2"

        for i in range(4):
            await AsyncSecret.create(f"s{i}", "v", **opts)
        pages, paginator = [], AsyncSecret.list(limit=2, **opts)
        while paginator.has_next:
            pages.append([s.name for s in await paginator.next_items()])
        assert pages == [["openai-key", "s0"], ["s1", "s2"], ["s3"]]

        with pytest.raises(SecretException):  # the name is taken
            await AsyncSecret.create("openai-key", "x", **opts)
        assert await AsyncSecret.destroy(info.secret_id, **opts) is True
        assert await AsyncSecret.exists("openai-key", **opts) is False
        assert await AsyncSecret.destroy("openai-key", **opts) is False


async def test_values_are_encrypted_at_rest_and_never_returned(
        node: Node, client: httpx.AsyncClient) -> None:  # fmt: skip
    r = await client.post("/secrets", json={"name": "tok", "value": VALUE})
    assert r.status_code == 201 and VALUE not in r.text and "value" not in r.json()
    for path in ("/secrets", "/secrets/tok"):
        assert VALUE not in (await client.get(path)).text
    raw = b"".join(p.read_bytes() for p in node.config.data_dir.glob("*.db*"))
    assert VALUE.encode() not in raw  # the database files, WAL included
    db = sqlite3.connect(node.config.db_path)
    sealed = db.execute("SELECT sealed FROM secret_versions").fetchone()[0]
    db.close()
    assert len(sealed) == 12 + len(VALUE) + 16  # nonce, ciphertext, tag
    assert len(load_key(key_path(node.config))) == 32
    assert oct(key_path(node.config).stat().st_mode & 0o777) == "0o600"


async def test_bad_input_is_a_clear_error(client: httpx.AsyncClient, tmp_path: Path) -> None:
    for body, text in [
        ({"name": "", "value": "v"}, "non-empty"),
        ({"name": "a{b}", "value": "v"}, "'{', '}'"),
        ({"name": "sec_x", "value": "v"}, "prefix"),
        ({"name": "n", "value": ""}, "non-empty string"),
        ({"name": "n", "value": "v" * 70000}, "at most 65536 bytes"),
        ({"name": "n", "value": "v", "metadata": {str(i): "" for i in range(33)}}, "32"),
        ({"name": "n", "value": "v", "metadata": {"k": 1}}, "strings"),
        ({"name": "n"}, "value"),
    ]:
        assert_error(await client.post("/secrets", json=body), 400, text)
    assert_error(await client.get("/secrets/nope"), 404, "not found")
    assert_error(await client.post("/secrets/nope", json={"value": "v"}), 404, "not found")
    assert_error(await client.delete("/secrets/nope"), 404, "not found")
    assert_error(await client.get("/secrets", params={"nextToken": "!!"}), 400, "nextToken")
    assert_error(await client.get("/secrets", params={"limit": 0}), 400, "limit")
    assert_error(await client.get("/secrets", headers={"X-API-Key": "wrong"}), 401)
    assert (await client.get("/secrets")).json() == []
