"""Snapshot checksums on real files: chunking, holes, verify/scrub marking a snapshot
corrupt, the state check every restore makes, and crash safety of the record."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from aenv.config import MachineShape
from aenv.orchestrator import background
from aenv.storage import checksums
from aenv.storage.checksums import CHUNK_SIZE, ZERO, Pacer
from aenv.storage.snapshots import (
    CHECKSUMS_FILE,
    CORRUPT_FILE,
    Manifest,
    SnapshotNotFound,
    SnapshotStore,
    SnapshotUnusable,
    check_restorable,
)

MIB = 1 << 20


def _sparse(path: Path, size: int, writes: dict[int, bytes]) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
        for off, data in writes.items():
            f.seek(off)
            f.write(data)
    return path


def _flip(path: Path, offset: int) -> None:
    path.chmod(0o644)  # snapshot files are 0444 (root writes anyway; others need this)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def _manifest(sid: str) -> Manifest:
    return Manifest(snapshot_id=sid, shape=MachineShape(), kernel="/k", tools="/t",
                    cmdline="", template="base")


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, Path]:
    src = tmp_path / "src"
    src.mkdir()
    return {
        "state": _sparse(src / "state", 0, {0: os.urandom(100_000)}),
        "memory": _sparse(src / "memory", 24 * MIB,
                          {3 * MIB: os.urandom(2 * MIB), 17 * MIB + 5: b"x"}),
        "disk": _sparse(src / "disk", 16 * MIB, {9 * MIB: os.urandom(4096)}),
    }


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    return SnapshotStore(tmp_path / "snapshots")


def _put(store: SnapshotStore, sources: dict[str, Path], sid: str = "snap-a",
         **kw: bool) -> str:
    store.put(_manifest(sid), sources, **kw)
    return sid


# -- chunking and holes ----------------------------------------------------------------------

def test_chunks_are_sha256_of_each_4mib_slice_and_the_tail(tmp_path: Path) -> None:
    data = os.urandom(2 * CHUNK_SIZE + 12345)
    p = tmp_path / "f"
    p.write_bytes(data)
    sums = checksums.file_sums(p)
    assert sums.size == len(data)
    assert list(sums.chunks) == [
        hashlib.sha256(data[i:i + CHUNK_SIZE]).hexdigest()
        for i in range(0, len(data), CHUNK_SIZE)
    ]
    assert checksums.file_sums(tmp_path / "f", chunk_size=MIB).chunks[5] == hashlib.sha256(
        data[5 * MIB:6 * MIB]).hexdigest()


def test_holes_are_zero_entries_and_not_read(tmp_path: Path) -> None:
    page = os.urandom(4096)
    p = _sparse(tmp_path / "ram", 64 * MIB, {10 * MIB: page, 40 * MIB + 1: b"y"})
    pacer = Pacer()
    sums = checksums.file_sums(p, pacer=pacer)
    assert len(sums.chunks) == 16
    logical = bytearray(CHUNK_SIZE)
    logical[2 * MIB:2 * MIB + 4096] = page  # offset 10 MiB is 2 MiB into chunk 2
    assert sums.chunks[2] == hashlib.sha256(logical).hexdigest()
    assert sums.chunks[10] not in (ZERO, sums.chunks[2])
    assert [i for i, c in enumerate(sums.chunks) if c != ZERO] == [2, 10]
    # Only the data blocks were read, not 64 MiB (nor two whole chunks).
    assert 0 < pacer.bytes_read <= 2 * 64 * 1024, pacer.bytes_read


def test_record_describes_content_not_allocation(tmp_path: Path) -> None:
    blob = os.urandom(8192)
    sparse = _sparse(tmp_path / "sparse", 12 * MIB, {5 * MIB: blob})
    dense = tmp_path / "dense"
    with open(dense, "wb") as f:  # the same bytes with every zero written out
        f.write(bytes(5 * MIB) + blob + bytes(12 * MIB - 5 * MIB - len(blob)))
    assert checksums.file_sums(sparse) == checksums.file_sums(dense)
    assert checksums.file_sums(dense).chunks[0] == ZERO


def test_pacer_bounds_the_read_rate(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(os.urandom(8 * MIB))
    t0 = time.monotonic()
    checksums.file_sums(p, pacer=Pacer(rate=16 * MIB))
    assert time.monotonic() - t0 >= 0.4  # 8 MiB at 16 MiB/s: about half a second


def test_stopping_a_pacer_interrupts_hashing(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(os.urandom(4 * CHUNK_SIZE))
    pacer = Pacer()
    pacer.stop.set()
    with pytest.raises(checksums.Interrupted):
        checksums.file_sums(p, pacer=pacer)


# -- the store: put, background record, verify -----------------------------------------------

def test_put_hashes_state_and_queues_the_snapshot(store: SnapshotStore, sources) -> None:
    sid = _put(store, sources)
    man = store.get(sid)
    assert man.state_sha256 == hashlib.sha256(sources["state"].read_bytes()).hexdigest()
    assert man.checksums == CHECKSUMS_FILE
    assert not (store.path(sid) / CHECKSUMS_FILE).exists()  # not on the put path
    assert store.next_pending() == sid and store.next_pending() is None
    check_restorable(store.path(sid), man)  # no record yet: restorable


def test_compute_then_verify_ok(store: SnapshotStore, sources) -> None:
    sid = _put(store, sources)
    assert store.verify(sid).status == "unverified"
    assert store.compute_checksums(sid) is True
    assert store.compute_checksums(sid) is False  # already there
    rec = checksums.read_record(store.path(sid) / CHECKSUMS_FILE)
    assert rec is not None and set(rec.files) == {"state", "memory", "disk"}
    assert rec.files["memory"].size == 24 * MIB and len(rec.files["memory"].chunks) == 6
    assert rec.files["state"].chunks[0] == store.get(sid).state_sha256
    assert store.verify(sid).status == "ok"


def test_flipped_memory_byte_is_found_and_the_snapshot_becomes_unusable(
        store: SnapshotStore, sources) -> None:
    sid = _put(store, sources)
    store.compute_checksums(sid)
    _flip(store.file(sid, "memory"), 3 * MIB + 777)
    v = store.verify(sid)
    assert v.status == "corrupt"
    assert "memory: chunk 0 (offset 0) differs" in v.detail
    assert (store.path(sid) / CORRUPT_FILE).exists()
    assert store.corrupt_reason(sid) == v.detail
    with pytest.raises(SnapshotUnusable, match="marked corrupt"):
        check_restorable(store.path(sid), store.get(sid))
    assert store.verify(sid).status == "corrupt"  # stays so; no re-hash needed


def test_a_byte_written_into_a_hole_is_found(store: SnapshotStore, sources) -> None:
    sid = _put(store, sources)
    store.compute_checksums(sid)
    p = store.file(sid, "disk")
    p.chmod(0o644)
    with open(p, "r+b") as f:
        f.seek(14 * MIB)
        f.write(b"\x01")
    assert "disk: chunk 3" in store.verify(sid).detail


def test_a_filesystem_only_snapshot_holds_and_checks_the_disk_alone(
        store: SnapshotStore, sources) -> None:
    man = _manifest("snap-fs")
    man.memory = False
    store.put(man, {"disk": sources["disk"]})  # no state or RAM file to take
    d = store.path("snap-fs")
    assert sorted(p.name for p in d.iterdir()) == ["disk", "manifest.json"]
    got = store.get("snap-fs")
    assert got.memory is False and got.files == ("disk",) and got.state_sha256 is None
    check_restorable(d, got)
    assert store.compute_checksums("snap-fs") is True
    assert set(checksums.read_record(d / CHECKSUMS_FILE).files) == {"disk"}  # type: ignore[union-attr]
    assert store.verify("snap-fs").status == "ok"
    _flip(store.file("snap-fs", "disk"), 9 * MIB + 10)
    assert "disk: chunk 2" in store.verify("snap-fs").detail
    with pytest.raises(SnapshotUnusable, match="marked corrupt"):
        check_restorable(d, got)
    # A full snapshot's manifest from before the flag existed reads as a full one.
    old = json.loads((store.path(_put(store, sources)) / "manifest.json").read_text())
    del old["memory"]
    assert Manifest.from_json(old).memory is True


def test_tampered_state_is_refused_at_restore(store: SnapshotStore, sources) -> None:
    sid = _put(store, sources)
    man = store.get(sid)
    _flip(store.file(sid, "state"), 50_000)
    with pytest.raises(SnapshotUnusable, match="device state sha256"):
        check_restorable(store.path(sid), man)
    sid2 = _put(store, sources, "snap-b")
    _flip(store.file(sid2, "state"), 50_000)
    assert store.verify(sid2).status == "corrupt"  # even before its record exists
    store.compute_checksums(sid)  # a record made after the damage does not launder it
    assert "state: sha256 is not the manifest's" in store.verify(sid).detail


def test_paused_state_check_uses_the_manifest_in_that_directory(tmp_path: Path) -> None:
    vm = tmp_path / "vm"
    vm.mkdir()
    (vm / "state").write_bytes(b"device state")
    man = _manifest("sbx1")
    check_restorable(vm, man)  # no hash recorded (paused before checksums): not checked
    man.state_sha256 = checksums.sha256_file(vm / "state")
    check_restorable(vm, man)
    (vm / "state").write_bytes(b"device statf")
    with pytest.raises(SnapshotUnusable):
        check_restorable(vm, man)


def test_corrupt_record_json_marks_the_snapshot(store: SnapshotStore, sources) -> None:
    sid = _put(store, sources)
    store.compute_checksums(sid)
    rec = store.path(sid) / CHECKSUMS_FILE
    data = json.loads(rec.read_text())
    data["files"]["disk"]["chunks"].pop()  # wrong chunk count for its size
    rec.write_text(json.dumps(data))
    v = store.verify(sid)
    assert v.status == "corrupt" and "checksum record unreadable" in v.detail
    sid2 = _put(store, sources, "snap-b")
    (store.path(sid2) / CHECKSUMS_FILE).write_text('{"format_version": 1, "files": {"st')
    assert "checksum record unreadable" in store.verify(sid2).detail


def test_transient_and_old_snapshots(store: SnapshotStore, sources) -> None:
    fork = _put(store, sources, "fork-x", checksums=False)
    assert store.get(fork).checksums is None and store.next_pending() is None
    assert store.verify(fork).status == "unverified"
    assert store.compute_checksums(fork) is False
    # A manifest from before checksums (no such keys): queued, and restorable meanwhile.
    old = _put(store, sources, "tpl-old")
    store.pending.clear()
    m = store.path(old) / "manifest.json"
    data = json.loads(m.read_text())
    del data["checksums"], data["state_sha256"]
    m.write_text(json.dumps(data))
    check_restorable(store.path(old), store.get(old))
    assert store.queue_missing() == ["tpl-old"]
    assert store.compute_checksums(old) is True
    assert store.verify(old).status == "ok"
    # ...and its state hash is filled in: restores check it from now on. A snapshot that
    # got its record before that (an earlier node) is queued for the state hash alone.
    assert store.get(old).state_sha256 == checksums.sha256_file(store.file(old, "state"))
    data = json.loads(m.read_text())
    del data["state_sha256"]
    m.write_text(json.dumps(data))
    record = (store.path(old) / CHECKSUMS_FILE).read_bytes()
    assert store.queue_missing() == ["tpl-old"] and store.compute_checksums(old) is True
    assert (store.path(old) / CHECKSUMS_FILE).read_bytes() == record
    assert store.queue_missing() == [] and store.compute_checksums(old) is False
    _flip(store.file(old, "state"), 10)
    with pytest.raises(SnapshotUnusable):
        check_restorable(store.path(old), store.get(old))


# -- deletion, interruption and crashes -------------------------------------------------------

def test_delete_during_hashing(store: SnapshotStore, tmp_path: Path) -> None:
    src = {"state": _sparse(tmp_path / "s", 0, {0: b"s" * 1000}),
           "memory": _sparse(tmp_path / "m", 32 * MIB, {0: os.urandom(32 * MIB)}),
           "disk": _sparse(tmp_path / "d", MIB, {})}
    sid = _put(store, src)
    err: list[BaseException] = []
    started = threading.Event()

    class Slow(Pacer):
        def step(self, nbytes: int) -> None:
            started.set()
            super().step(nbytes)

    def run() -> None:
        try:
            store.compute_checksums(sid, Slow(rate=16 * MIB))
        except BaseException as e:
            err.append(e)

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(10)
    store.delete(sid)
    t.join(30)
    assert [type(e) for e in err] == [SnapshotNotFound]
    assert list(store.root.iterdir()) == []  # nothing written where it was


def test_a_crash_while_hashing_leaves_no_record(store: SnapshotStore, tmp_path: Path) -> None:
    src = {"state": _sparse(tmp_path / "s", 0, {0: b"s" * 1000}),
           "memory": _sparse(tmp_path / "m", 64 * MIB, {0: os.urandom(64 * MIB)}),
           "disk": _sparse(tmp_path / "d", MIB, {})}
    sid = _put(store, src)
    script = (
        "import sys; from pathlib import Path\n"
        "from aenv.storage.snapshots import SnapshotStore\n"
        "from aenv.storage.checksums import Pacer\n"
        "print('go', flush=True)\n"
        "SnapshotStore(Path(sys.argv[1])).compute_checksums(sys.argv[2], Pacer(rate=8<<20))\n"
    )
    p = subprocess.Popen([sys.executable, "-c", script, str(store.root), sid],
                         stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"go\n"
    time.sleep(1.0)
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    assert not (store.path(sid) / CHECKSUMS_FILE).exists()
    assert store.verify(sid).status == "unverified"  # not corrupt: just not done yet
    # What a crash between write and rename leaves: a temporary file, never read as the
    # record, removed by the start-up clean-up once stale.
    tmp = store.path(sid) / f".{CHECKSUMS_FILE}.999-abc.tmp"
    tmp.write_text('{"format_version": 1, "fi')
    assert store.queue_missing() == [sid]
    assert store.compute_checksums(sid) is True and store.verify(sid).status == "ok"
    os.utime(tmp, (time.time() - 7200, time.time() - 7200))
    store.gc_staging()
    assert not tmp.exists()


# -- the scrubber pass ------------------------------------------------------------------------

async def test_scrub_pass_marks_only_the_damaged_snapshot(store: SnapshotStore, sources) -> None:
    good, bad = _put(store, sources, "snap-good"), _put(store, sources, "snap-bad")
    new = _put(store, sources, "snap-new")  # no record yet
    for sid in (good, bad):
        store.compute_checksums(sid)
    _flip(store.file(bad, "disk"), 9 * MIB + 10)
    out = await background.scrub(store, Pacer(rate=256 * MIB))
    assert {v.snapshot_id: v.status for v in out} == {
        good: "ok", bad: "corrupt", new: "unverified"}
    assert store.corrupt_reason(bad) and store.corrupt_reason(good) is None
    again = await background.scrub(store, Pacer())
    assert bad not in {v.snapshot_id for v in again}  # already marked: skipped
