"""A cluster's secrets in a real etcd (`cluster/secrets.py`): what one node writes, another
reads and resolves; values are sealed in etcd; a node with another key refuses to join."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from aenv.cluster.etcd import Etcd
from aenv.cluster.secrets import KEEP_VERSIONS, EtcdSecrets, SecretsKeyMismatch
from aenv.secrets.store import SecretError, SecretExists, SecretNotFound
from aenv.secrets.vault import Vault, load_key
from aenv.teams.model import DEFAULT_TEAM as D

VALUE = "sk-cluster-7a1b2c3d"


async def test_one_node_writes_another_reads_and_the_value_is_sealed(
        etcd: Etcd, tmp_path: Path) -> None:  # fmt: skip
    p = f"/s{os.urandom(3).hex()}/"
    key = load_key(tmp_path / "secrets.key")  # the file every node is given
    n0, n1 = EtcdSecrets(etcd, p, Vault(key)), EtcdSecrets(etcd, p, Vault(key))
    for n in (n0, n1):
        await n.join(key, explicit=True)
    assert await etcd.get(p + "secrets/key") is None  # an explicit key never enters etcd
    info = await n0.create(D, "Api-Key", VALUE, {"team": "rl"})
    assert (await n1.get(D, "api-key")).secret_id == info.secret_id
    assert await n1.value(D, info.secret_id) == VALUE
    await n1.update(D, "api-key", VALUE + "-2")
    assert (await n0.get(D, info.secret_id)).version == 2
    assert await n0.value(D, "api-key") == VALUE + "-2"
    kvs, _ = await etcd.get_prefix(p)
    assert kvs and all(VALUE.encode() not in kv.value for kv in kvs)  # sealed at rest

    with pytest.raises(SecretExists):
        await n1.create(D, "api-key", "x")
    # Concurrent updates each land as a version of their own.
    await asyncio.gather(*(n.update(D, "api-key", f"v{i}") for i, n in
                           enumerate([n0, n1] * 3)))  # fmt: skip
    assert (await n0.get(D, "api-key")).version == 8
    for _ in range(KEEP_VERSIONS + 2):
        await n0.update(D, "api-key", "again")
    assert await n1.value(D, "api-key") == "again"

    for i in range(3):
        await n0.create(D, f"s{i}", "v")
    page, token = await n1.page(D, 2, None)
    rest, end = await n1.page(D, 2, token)
    assert [s.name for s in page + rest] == ["api-key", "s0", "s1", "s2"] and end is None
    with pytest.raises(SecretError):
        await n1.page(D, 0, None)

    await n1.delete(D, "api-key")
    for ref in ("api-key", info.secret_id):
        with pytest.raises(SecretNotFound):
            await n0.get(D, ref)
    await n0.create(D, "api-key", "reborn")  # the name is free again

    # Another team: its own names, and nothing of the default team's by id or name.
    blue = await n1.create("blue", "api-key", "blue-value")
    assert await n0.value("blue", "api-key") == "blue-value"
    assert await n0.value(D, "api-key") == "reborn"
    for ref in ("s0", (await n0.get(D, "s0")).secret_id):
        with pytest.raises(SecretNotFound):
            await n1.get("blue", ref)
    with pytest.raises(SecretNotFound):
        await n0.get(D, blue.secret_id)
    assert [s.name for s in (await n0.page("blue", 10, None))[0]] == ["api-key"]
    assert await n0.count("blue") == 1 and await n0.count(D) == 4
    await n0.delete("blue", "api-key")
    assert await n1.value(D, "api-key") == "reborn"


async def test_nodes_without_key_files_adopt_the_first_ones_key_and_ca(
        etcd: Etcd, tmp_path: Path) -> None:  # fmt: skip
    p = f"/s{os.urandom(3).hex()}/"
    ka, kb = load_key(tmp_path / "a.key"), load_key(tmp_path / "b.key")
    a, b = EtcdSecrets(etcd, p, Vault(ka)), EtcdSecrets(etcd, p, Vault(kb))
    await a.join(ka, explicit=False)
    await b.join(kb, explicit=False)  # adopts a's
    await a.create(D, "k", VALUE)
    assert await b.value(D, "k") == VALUE
    assert await a.join_ca("CERT-A", "KEY-A", explicit=False) == ("CERT-A", "KEY-A")
    assert await b.join_ca("CERT-B", "KEY-B", explicit=False) == ("CERT-A", "KEY-A")


async def test_a_node_with_another_explicit_key_or_ca_refuses_to_join(
        etcd: Etcd, tmp_path: Path) -> None:  # fmt: skip
    p = f"/s{os.urandom(3).hex()}/"
    ka, kb = load_key(tmp_path / "a.key"), load_key(tmp_path / "b.key")
    await EtcdSecrets(etcd, p, Vault(ka)).join(ka, explicit=True)
    with pytest.raises(SecretsKeyMismatch, match="secrets_key_file"):
        await EtcdSecrets(etcd, p, Vault(kb)).join(kb, explicit=True)
    a = EtcdSecrets(etcd, p, Vault(ka))
    assert await a.join_ca("PEM-ONE\n", "K", explicit=True) == ("PEM-ONE\n", "K")
    await a.join_ca("PEM-ONE", "K", explicit=True)  # the same certificate
    with pytest.raises(SecretsKeyMismatch, match="ca_cert_file"):
        await a.join_ca("PEM-TWO", "K2", explicit=True)
    doc = await etcd.get(p + "secrets/egress-ca")
    assert doc is not None and b"K" not in doc.value.replace(b"PEM", b"")  # no key
