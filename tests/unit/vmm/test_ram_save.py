"""A RAM file saved in place stays root's and read-only (vmm/ram.py): a snapshot may link
it, and every VM restored from that snapshot maps it, so the jail of the VM it came from must
not own it. This test process stands in for the VMM: it maps a file private and writes."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from aenv.vmm import ram

PAGE = mmap.PAGESIZE
JAIL_UID = 880123  # a jail's uid: a cold-booted VM's RAM file is its own


def test_a_save_in_place_makes_the_file_roots_and_read_only(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    f = tmp_path / "memory"
    size = 16 * PAGE
    f.write_bytes(bytes(size))
    os.chown(f, JAIL_UID, JAIL_UID)
    f.chmod(0o600)
    with open(f, "r+b") as fh:
        m = mmap.mmap(fh.fileno(), size, flags=mmap.MAP_PRIVATE)
    try:
        m[PAGE:PAGE + 5] = b"guest"  # the "guest" writes one page
        saved = ram.save(os.getpid(), f, size)
    finally:
        m.close()
    assert saved.in_place and saved.written == PAGE
    st = f.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o444)
    assert f.read_bytes()[PAGE:PAGE + 5] == b"guest"


def test_readable_repairs_a_ram_file_a_jail_owns(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown needs root")
    f = tmp_path / "memory"
    f.write_bytes(bytes(PAGE))
    os.chown(f, JAIL_UID, JAIL_UID)
    f.chmod(0o644)
    ram.readable(f)
    st = f.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o444)
