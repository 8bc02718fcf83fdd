"""gc_staging removes what a dead put left, never what a live one (another node's) is writing."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from aenv.storage.snapshots import SnapshotStore

HOLD = ("import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "time.sleep(60)\n")


def test_a_live_writers_staging_stays_a_dead_ones_goes(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)
    for name in (".tmp-live", ".tmp-dead", ".del-old"):
        (tmp_path / name).mkdir()
    (tmp_path / ".tmp-dead" / "memory").write_bytes(b"x")
    writer = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / ".tmp-live")],
                              stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"locked\n"
        time.sleep(1.1)  # past the instant between a put's mkdir and its lock
        store.gc_staging()
        assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-live"]
    finally:
        writer.kill()
        writer.wait()
    store.gc_staging()  # its writer died: now it is a leftover
    assert list(tmp_path.iterdir()) == []


def test_a_fresh_staging_dir_is_not_taken_before_its_writer_locks_it(tmp_path: Path) -> None:
    (tmp_path / ".tmp-new").mkdir()
    SnapshotStore(tmp_path).gc_staging()
    assert (tmp_path / ".tmp-new").exists()
