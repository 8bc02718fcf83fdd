"""Snapshot transfer rows of bench/cluster.py: one real snapshot (a sandbox of `base` that
ran a little), published to a loopback S3 (moto, through boto3) and fetched back, and
fetched from the node that holds it as a peer (range requests on its cluster routes).
Each row: throughput over the snapshot's logical size, and the bytes that moved."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid

import boto3
import httpx

from aenv.cluster.peers import PeerChunks, describe
from aenv.storage import checksums as sums
from aenv.store import transfer
from aenv.store.objects import S3Objects
from aenv.store.published import Published
from tests.support.host import DATA_DIR
from tests.support.s3 import moto_s3

MIB = 1 << 20


def _row(moved: transfer.Moved, seconds: float) -> str:
    return (f"{moved.moved_bytes / MIB:.0f} of {moved.logical_bytes / MIB:.0f} MiB moved in "
            f"{seconds:.2f} s: {moved.moved_bytes / MIB / seconds:.0f} MiB/s moved, "
            f"{moved.logical_bytes / MIB / seconds:.0f} MiB/s of snapshot")  # fmt: skip


def transfer_rows(g: httpx.Client, node_origin: str, token: str) -> dict[str, str]:
    """`g`: an API client of the cluster; the node at `node_origin` holds the snapshot."""
    rows: dict[str, str] = {}
    sbx = g.post("/v2/sandboxes", json={"templateID": "base", "timeout": 600}).json()
    sid = sbx["sandboxID"]
    out = DATA_DIR / f".bench-transfer-{uuid.uuid4().hex[:6]}"  # the data filesystem
    try:
        snap = g.post(f"/sandboxes/{sid}/snapshots", json={}).json()["snapshotID"]
        src = DATA_DIR / "snapshots" / snap
        deadline = time.monotonic() + 300  # its checksums come from the background worker
        while (rec := sums.read_record(src / "checksums.json")) is None:
            if time.monotonic() > deadline:
                raise SystemExit("no checksum record for the snapshot")
            time.sleep(0.5)
        with moto_s3() as s3:
            boto3.client("s3", endpoint_url=s3.endpoint_url).create_bucket(Bucket="bench")
            store = S3Objects("bench", prefix="b/", endpoint_url=s3.endpoint_url)
            t0 = time.perf_counter()
            moved = transfer.publish(store, src, rec)
            rows["publish to S3 (moto), first"] = _row(moved, time.perf_counter() - t0)
            t0 = time.perf_counter()
            moved = transfer.publish(store, src, rec)
            rows["publish to S3 again (every chunk there)"] = _row(moved, time.perf_counter() - t0)
            pub = transfer.published(store, snap)
            t0 = time.perf_counter()
            moved = transfer.fetch(pub, out / "s3", [transfer.StoreChunks(store)])
            rows["fetch from S3, cold (no local chunks)"] = _row(moved, time.perf_counter() - t0)
        pub2 = asyncio.run(_describe(node_origin, snap, token))
        if pub2 is None:
            raise SystemExit("the node did not describe its snapshot")
        with httpx.Client() as client:
            peer = PeerChunks("bench", node_origin, snap, token, client)
            t0 = time.perf_counter()
            moved = transfer.fetch(pub2, out / "peer", [peer])
            rows["fetch from a peer, cold (range requests)"] = _row(moved,
                                                                    time.perf_counter() - t0)
        g.delete(f"/templates/{snap}").raise_for_status()  # a snapshot is deleted as a template
    finally:
        g.delete(f"/sandboxes/{sid}")
        shutil.rmtree(out, ignore_errors=True)
    return rows



async def _describe(origin: str, snap: str, token: str) -> Published | None:
    async with httpx.AsyncClient() as a:
        return await describe(a, origin, snap, token)
