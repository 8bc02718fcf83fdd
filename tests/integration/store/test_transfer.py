"""The snapshot store's transfer (issue 14, item 6) against a real S3 API (moto in server
mode, through boto3) and a shared directory: sparse, chunked, content-addressed and
checksummed; zero chunks never sent, chunks shared with the template sent once, chunks a
node already holds never downloaded; a corrupt chunk refused."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from aenv.storage.checksums import CHUNK_SIZE, ChecksumRecord, file_sums
from aenv.store.objects import FsObjects, ObjectStore, S3Objects
from aenv.store.published import Compat, chunk_key
from aenv.store.transfer import (
    StoreChunks,
    TransferError,
    fetch,
    local_chunks,
    publish,
    published,
)
from tests.support.s3 import moto_s3

MIB = 1 << 20


def _snapshot(d: Path, sid: str, data_chunks: dict[str, list[int]],
              seed: bytes) -> ChecksumRecord:  # fmt: skip
    """Sparse files of 16 chunks each, with random data in the chunks listed."""
    d.mkdir(parents=True)
    for name, chunks in data_chunks.items():
        with open(d / name, "wb") as f:
            f.truncate(16 * CHUNK_SIZE)
            for i in chunks:
                f.seek(i * CHUNK_SIZE)
                block = hashlib.sha256(seed + name.encode() + bytes([i])).digest()
                f.write(block * (CHUNK_SIZE // 32))
    (d / "manifest.json").write_text(f'{{"snapshot_id": "{sid}"}}')
    return _record(d, sid, list(data_chunks))


def _record(d: Path, sid: str, names: list[str]) -> ChecksumRecord:
    return ChecksumRecord(snapshot_id=sid, created_at="2026-12-01T00:00:00Z",
                          files={n: file_sums(d / n) for n in names})  # fmt: skip


def _same(a: Path, b: Path) -> bool:
    return hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()


@pytest.fixture(params=["s3", "fs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "fs":
        yield FsObjects(tmp_path / "shared")
        return
    with moto_s3() as s3:
        boto3.client("s3", endpoint_url=s3.endpoint_url).create_bucket(Bucket="aenv")
        yield S3Objects("aenv", prefix="cluster-a/", endpoint_url=s3.endpoint_url)


def test_publish_sends_each_chunk_once_and_fetch_only_what_the_node_lacks(
    store: ObjectStore, tmp_path: Path
) -> None:
    tpl = tmp_path / "tpl"
    rec_t = _snapshot(tpl, "tpl", {"memory": [0, 1, 5], "disk": [0, 2]}, b"t")
    # A snapshot made from it: the template's files, two chunks changed, one added.
    snap = tmp_path / "snap"
    shutil.copytree(tpl, snap)
    (snap / "manifest.json").write_text('{"snapshot_id": "snap"}')
    with open(snap / "memory", "r+b") as f:
        for i in (1, 9):
            f.seek(i * CHUNK_SIZE)
            f.write(os.urandom(CHUNK_SIZE))
    rec_s = _record(snap, "snap", ["memory", "disk"])

    t = publish(store, tpl, rec_t, kind="template", compat=Compat(kernel="k1"))
    assert (t.chunks, t.zero, t.moved, t.present) == (32, 27, 5, 0)
    assert t.moved_bytes == 5 * CHUNK_SIZE and t.logical_bytes == 32 * CHUNK_SIZE
    s = publish(store, snap, rec_s)
    # Only the two chunks the template lacks travel; its other four are in the store.
    assert (s.moved, s.present, s.zero) == (2, 4, 26)

    pub = published(store, "snap")
    assert pub.files["memory"].chunks == rec_s.files["memory"].chunks
    cold = fetch(pub, tmp_path / "cold", [StoreChunks(store)])
    assert (cold.moved, cold.present) == (6, 0)
    warm = fetch(pub, tmp_path / "warm", [StoreChunks(store)], local=local_chunks({tpl: rec_t}))
    assert (warm.moved, warm.present) == (2, 4)  # the template's chunks came from disk
    for d in ("cold", "warm"):
        for name in ("memory", "disk"):
            assert _same(snap / name, tmp_path / d / name), (d, name)
        # Sparse: the zero chunks are holes, not written zeros.
        assert os.stat(tmp_path / d / "memory").st_blocks * 512 <= 5 * CHUNK_SIZE + MIB
    assert (tmp_path / "warm" / "manifest.json").read_text() == '{"snapshot_id": "snap"}'
    assert published(store, "tpl").compat.kernel == "k1"


def test_a_corrupt_chunk_in_the_store_is_refused_and_a_changed_file_is_not_published(
    store: ObjectStore, tmp_path: Path
) -> None:
    d = tmp_path / "s"
    rec = _snapshot(d, "s", {"memory": [3]}, b"c")
    publish(store, d, rec)
    digest = rec.files["memory"].chunks[3]
    store.put(chunk_key(digest), os.urandom(CHUNK_SIZE))
    with pytest.raises(TransferError, match="corrupt"):
        fetch(published(store, "s"), tmp_path / "out", [StoreChunks(store)])
    with open(d / "memory", "r+b") as f:  # changed after its checksums were recorded
        f.seek(7 * CHUNK_SIZE)
        f.write(b"x" * 100)
        f.seek(3 * CHUNK_SIZE)
        f.write(b"y" * 100)
    store.delete(chunk_key(digest))
    with pytest.raises(TransferError, match="changed"):
        publish(store, d, rec)


def test_compatibility_is_checked_field_by_field() -> None:
    snap = Compat(qemu="7.2", kernel="k", tools="t", accel="kvm", cpu="EPYC")
    assert snap.mismatch(Compat(qemu="7.2", kernel="k", tools="t", accel="kvm", cpu="EPYC")) is None
    assert "kernel" in (snap.mismatch(Compat(qemu="7.2", kernel="k2", tools="t")) or "")
    assert "accel" in (snap.mismatch(Compat(accel="tcg")) or "")
    assert "CPU" in (snap.mismatch(Compat(accel="kvm", cpu="Xeon")) or "")
    assert Compat(accel="tcg", cpu="a").mismatch(Compat(accel="tcg", cpu="b")) is None
