"""A cluster's teams and keys in a real etcd (`cluster/teams.py`): what one node or gateway
makes, every other one knows within a watch event; a revoked key stops everywhere; only
hashes are stored; a name is taken by one team in the whole cluster; a joining node brings
its own."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from aenv.cluster.etcd import Etcd
from aenv.cluster.teams import EtcdTeams
from aenv.teams.model import DEFAULT_TEAM, NODE_KEY_ID, TeamError, TeamExists, TeamNotFound
from aenv.teams.store import KeyNotFound, TeamStore


async def _soon(check: Callable[[], bool], what: str) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"not seen within 2 s: {what}")


async def test_what_one_node_makes_every_other_knows_and_revocation_reaches_all(
        etcd: Etcd) -> None:  # fmt: skip
    p = f"/t{os.urandom(3).hex()}/"
    a, b = EtcdTeams(etcd, p), EtcdTeams(etcd, p)
    await a.start()
    await b.start()
    try:
        await a.bind_node_key("cluster-key")
        await b.bind_node_key("cluster-key")  # the same key: nothing changes
        assert b.principal("cluster-key") is not None
        assert a.principal("cluster-key").admin  # type: ignore[union-attr]
        team = await a.create_team("blue", max_sandboxes=3)
        with pytest.raises(TeamExists):
            await a.create_team("blue")
        await _soon(lambda: any(t.name == "blue" for t in b.teams()), "the team on b")
        with pytest.raises(TeamExists):
            await b.create_team("blue")  # taken in the whole cluster
        assert b.team("blue").max_sandboxes == 3
        rec, key = await b.create_key("blue", "trainer")
        assert b.principal(key).team_id == team.team_id  # type: ignore[union-attr]
        await _soon(lambda: a.principal(key) is not None, "the key on a")
        kvs, _ = await etcd.get_prefix(p)
        assert kvs and all(key.encode() not in kv.value for kv in kvs)  # hashes only

        await a.set_limits("blue", max_memory_mib=2048, max_sandboxes=None)
        await _soon(lambda: b.team("blue").max_memory_mib == 2048, "the limit on b")
        assert b.team("blue").max_sandboxes is None
        assert b.team("blue").image_registries is None  # the node's list
        await a.set_limits("blue", image_registries=["ghcr.io/org"])
        await _soon(lambda: b.team("blue").image_registries == ("ghcr.io/org",),
                    "the registries on b")  # fmt: skip

        await a.revoke(rec.key_id)
        assert a.principal(key) is None  # at once where it was revoked
        await _soon(lambda: b.principal(key) is None, "the revocation on b")
        assert b.key(rec.key_id).revoked_us is not None
        for bad in (a.revoke(NODE_KEY_ID), a.delete_team(DEFAULT_TEAM)):
            with pytest.raises(TeamError):
                await bad
        with pytest.raises(KeyNotFound):
            await a.revoke("key_nope")
        await b.delete_team("blue")
        await _soon(lambda: not any(t.name == "blue" for t in a.teams()), "the delete on a")
        with pytest.raises(TeamNotFound):
            a.team(team.team_id)
        # its keys went too (their deletes reach a by the watch, after the team's)
        await _soon(lambda: [k.key_id for k in a.keys(team_ref=None)] == [NODE_KEY_ID],
                    "the keys' deletes on a")
        assert [k.key_id for k in a.keys(team_ref=None)] == [NODE_KEY_ID]
        await a.create_team("blue")  # the name is free again
    finally:
        await a.stop()
        await b.stop()


async def test_a_new_cluster_key_replaces_the_old_one(etcd: Etcd) -> None:
    p = f"/t{os.urandom(3).hex()}/"
    a = EtcdTeams(etcd, p)
    await a.start()
    try:
        await a.bind_node_key("old")
        await a.bind_node_key("new")
        assert a.principal("old") is None and a.principal("new") is not None
        assert [t.team_id for t in a.teams()] == [DEFAULT_TEAM]
    finally:
        await a.stop()


async def test_a_joining_nodes_own_teams_and_keys_come_with_their_ids(
        etcd: Etcd, tmp_path: Path) -> None:  # fmt: skip
    """A node's database (real SQLite) carried into the cluster: same team ids (its records
    stay its teams'), same keys (hashes only), revoked ones revoked; a team whose name the
    cluster already gives another team stays out, with its keys; a second join adds
    nothing."""
    p = f"/t{os.urandom(3).hex()}/"
    db = sqlite3.connect(tmp_path / "node.db", isolation_level=None)
    db.execute("PRAGMA foreign_keys=ON")
    local = TeamStore(db)
    await local.bind_node_key("node-key")
    green = await local.create_team("green", max_sandboxes=4, image_registries=["127.0.0.1"])
    _, gkey = await local.create_key("green", "ci")
    gone, gone_key = await local.create_key("green", "old")
    await local.revoke(gone.key_id)
    await local.create_team("taken")
    _, tkey = await local.create_key("taken")
    _, dkey = await local.create_key(DEFAULT_TEAM, "ops", admin=True)
    cluster = EtcdTeams(etcd, p)
    await cluster.start()
    try:
        await cluster.create_team("taken")  # another team of that name, already there
        carry = (local.teams(), local.keys(), local.key_hashes())
        assert await cluster.carry(*carry) == ["taken"]
        assert cluster.team("green") == green
        assert cluster.principal(gkey).team_id == green.team_id  # type: ignore[union-attr]
        assert cluster.principal(dkey).admin  # type: ignore[union-attr]
        assert cluster.principal(gone_key) is None and cluster.key(gone.key_id).revoked_us
        assert cluster.principal(tkey) is None  # its team stayed out
        assert cluster.principal("node-key") is None  # the cluster's key is the cluster's
        kvs, _ = await etcd.get_prefix(p)
        assert all(gkey.encode() not in kv.value for kv in kvs)  # hashes only
        assert await cluster.carry(*carry) == ["taken"]  # again: nothing new
        other = EtcdTeams(etcd, p)  # another node or gateway knows them too
        await other.start()
        try:
            await _soon(lambda: other.principal(gkey) is not None, "the key on another")
        finally:
            await other.stop()
    finally:
        await cluster.stop()
        db.close()
