"""The etcd client (`cluster/etcd.py`) against a real etcd on loopback (Debian's
etcd-server): keys, prefixes, transactions, leases, watches, and failover between the
members of a three-member cluster."""

from __future__ import annotations

import asyncio
import signal

import pytest

from aenv.cluster.etcd import (
    Etcd,
    EtcdUnavailable,
    compare_version,
    prefix_end,
    put_op,
    range_op,
)
from tests.support.etcd import etcd_cluster, free_port


def test_prefix_end() -> None:
    assert prefix_end("/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"


async def test_put_get_prefix_delete(etcd: Etcd) -> None:
    r1 = await etcd.put("/t1/a", "1")
    await etcd.put("/t1/b", b"\x00\xff")
    await etcd.put("/t10", "not under /t1/")
    kv = await etcd.get("/t1/a")
    assert kv is not None and kv.value == b"1" and kv.mod_revision == r1 and kv.version == 1
    kvs, revision = await etcd.get_prefix("/t1/")
    assert [(k.key, k.value) for k in kvs] == [("/t1/a", b"1"), ("/t1/b", b"\x00\xff")]
    assert revision >= r1
    assert await etcd.delete("/t1/a") == 1 and await etcd.delete("/t1/a") == 0
    assert await etcd.get("/t1/a") is None


async def test_a_transaction_creates_a_key_exactly_once(etcd: Etcd) -> None:
    async def create(value: str) -> bool:
        r = await etcd.txn([compare_version("/t2/once", "EQUAL", 0)],
                           [put_op("/t2/once", value)], [range_op("/t2/once")])
        return r.succeeded

    results = await asyncio.gather(*(create(str(i)) for i in range(8)))
    assert sum(results) == 1
    winner = results.index(True)
    kv = await etcd.get("/t2/once")
    assert kv is not None and kv.value == str(winner).encode()
    lost = await etcd.txn([compare_version("/t2/once", "EQUAL", 0)], [], [range_op("/t2/once")])
    assert not lost.succeeded and lost.ranges()[0][0].value == str(winner).encode()


async def test_a_lease_keeps_its_keys_while_renewed_and_drops_them_when_it_ends(
    etcd: Etcd,
) -> None:
    lease = await etcd.grant(2)
    await etcd.put("/t3/held", "x", lease=lease)
    for _ in range(4):  # 3 s: past the TTL, renewed
        await asyncio.sleep(0.75)
        assert await etcd.keepalive(lease) > 0
    assert await etcd.get("/t3/held") is not None
    await asyncio.sleep(3.5)  # not renewed: expired
    assert await etcd.get("/t3/held") is None
    assert await etcd.keepalive(lease) == 0
    other = await etcd.grant(30)
    await etcd.put("/t3/revoked", "y", lease=other)
    await etcd.revoke(other)
    assert await etcd.get("/t3/revoked") is None
    await etcd.revoke(other)  # twice: not an error


async def test_a_watch_sees_puts_and_deletes_from_a_revision(etcd: Etcd) -> None:
    _, start = await etcd.get_prefix("/t4/")
    await etcd.put("/t4/a", "1")  # before the watch, after `start`: still seen
    seen: list[tuple[str, str, bytes]] = []

    async def follow() -> None:
        async for ev in etcd.watch_prefix("/t4/", start + 1):
            seen.append((ev.type, ev.kv.key, ev.kv.value))
            if len(seen) == 3:
                return

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.3)
    await etcd.put("/t4/b", "2")
    await etcd.put("/t5/other", "not watched")
    await etcd.delete("/t4/a")
    await asyncio.wait_for(task, 10)
    assert seen == [("PUT", "/t4/a", b"1"), ("PUT", "/t4/b", b"2"), ("DELETE", "/t4/a", b"")]


async def test_no_endpoint_is_etcd_unavailable() -> None:
    client = Etcd([f"http://127.0.0.1:{free_port()}"], retry_s=0.5)
    try:
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(EtcdUnavailable, match="no etcd endpoint answered"):
            await client.get("/x")
        assert asyncio.get_running_loop().time() - t0 >= 0.3  # retried, then gave up
    finally:
        await client.aclose()


async def test_a_request_fails_over_to_another_member_and_a_member_restart_keeps_data() -> None:
    with etcd_cluster(3) as c:
        client = Etcd(c.endpoints)
        try:
            await client.put("/t6/k", "before")
            first = c.members[0]
            first.stop(signal.SIGKILL)
            kv = await client.get("/t6/k")  # answered by another member
            assert kv is not None and kv.value == b"before"
            assert client.endpoints[0] != first.client_url
            await client.put("/t6/k", "during")
            c.restart(first)  # it catches up with what it missed
            alone = Etcd([first.client_url])
            try:
                kv = await alone.get("/t6/k")
                assert kv is not None and kv.value == b"during"
            finally:
                await alone.aclose()
        finally:
            await client.aclose()
