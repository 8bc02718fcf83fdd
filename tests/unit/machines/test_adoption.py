"""The pieces of re-adoption that need no VM: the adoption record and an adopted process.

The whole path (a node killed with -9, its QEMUs re-adopted) is tests/e2e/test_adopt.py.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
from pathlib import Path

import pytest

from aenv.config import MachineShape
from aenv.machines import adoption
from aenv.vmm.jail import UNKNOWN_STATUS, AdoptedProcess, JailIdentity, start_time


def _record() -> adoption.AdoptionRecord:
    return adoption.AdoptionRecord(
        sandbox_id="sbx1", template_id="base", slot_index=3, slot_addr="198.18.0.14",
        shape=MachineShape(), kernel="/k", tools="/t", cmdline="console=ttyS0",
        jail=JailIdentity(10, 20, 11, 21), access_token="tok",
    )


def test_record_round_trips_through_its_file(tmp_path: Path) -> None:
    adoption.write(tmp_path, _record())
    assert adoption.read(tmp_path) == _record()
    adoption.remove(tmp_path)
    with pytest.raises(adoption.NotAdoptable, match="no adoption record"):
        adoption.read(tmp_path)


def test_record_write_replaces_a_planted_symlink_instead_of_following_it(tmp_path: Path) -> None:
    target = tmp_path / "host-file"
    target.write_text("precious")
    vm_dir = tmp_path / "vm"
    vm_dir.mkdir()
    (vm_dir / adoption.FILE).symlink_to(target)
    adoption.write(vm_dir, _record())
    assert target.read_text() == "precious"
    st = (vm_dir / adoption.FILE).lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert adoption.read(vm_dir) == _record()
    assert [p.name for p in vm_dir.iterdir()] == [adoption.FILE]  # no temporary file left


@pytest.mark.parametrize("damage", ["symlink", "foreign_owner", "garbage", "newer_format"])
def test_record_that_the_jail_could_have_made_is_refused(tmp_path: Path, damage: str) -> None:
    adoption.write(tmp_path, _record())
    f = tmp_path / adoption.FILE
    if damage == "symlink":
        real = tmp_path / "elsewhere.json"
        f.rename(real)
        f.symlink_to(real)
    elif damage == "foreign_owner":
        if os.geteuid() != 0:
            pytest.skip("chown needs root")
        os.chown(f, 880003, 880003)  # a jail uid: the jail owns the VM's directory
    elif damage == "garbage":
        f.write_text("{not json")
    else:
        f.write_text(f.read_text().replace('"format_version": 1', '"format_version": 2'))
    with pytest.raises(adoption.NotAdoptable):
        adoption.read(tmp_path)


async def test_adopted_process_is_bound_to_its_start_time_and_can_be_killed() -> None:
    # Our child only so that the test can reap it: a pidfd sees exit the same way for a
    # process of any parent (an adopted launcher's is the host's init).
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        started = start_time(child.pid)
        assert started is not None
        assert AdoptedProcess.attach(child.pid, started + 1) is None  # another process
        proc = AdoptedProcess.attach(child.pid, started)
        assert proc is not None and proc.returncode is None
        proc.kill()
        # It exits (a zombie until reaped): wait returns, though the status is not ours.
        assert await asyncio.wait_for(proc.wait(), 10) == UNKNOWN_STATUS
        assert proc.returncode == UNKNOWN_STATUS
        proc.kill()  # idempotent once it has ended
        assert AdoptedProcess.attach(child.pid, started) is None  # a zombie is not adopted
    finally:
        child.kill()
        child.wait()
