"""Snapshot integrity on a live node with real VMs: background chunk checksums, the
scrubber marking a damaged snapshot, and restores refusing it (409, error_code
"snapshot_corrupt") while an intact snapshot still restores; a paused sandbox's tampered
device state is refused on resume and it stays paused."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxState
from e2b.exceptions import SandboxException

from aenv.storage.snapshots import CHECKSUMS_FILE, CORRUPT_FILE
from tests.support.host import DATA_DIR, qemu_pids

from .conftest import NodeProcess, running_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SNAPSHOTS = DATA_DIR / "snapshots"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    # A scrub pass every few seconds (templates included: ~0.5 GB of data, ~4 s at this
    # rate, ~10% of a core); a real node scrubs every few hours.
    # Cold pauses only: a resume here must read the paused state from disk (a hot resume
    # continues the kept VMM and reads nothing).
    with running_node(tmp_path_factory.mktemp("node"), AENV_SCRUB_INTERVAL_S="5",
                      AENV_SCRUB_RATE_MIB_S="128", AENV_HOT_PAUSE_S="0") as n:
        yield n


def _until(cond, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (got := cond()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.2)
    return got


def _flip(path: Path, offset: int) -> None:
    fd = os.open(path, os.O_RDWR)  # root: snapshot files are 0444, VM files the jail's
    try:
        b = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([b[0] ^ 0x01]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def _vm_entries(node: NodeProcess) -> set[str]:
    d = DATA_DIR / "sandboxes" / node.env["AENV_INSTANCE"]
    return {p.name for p in d.iterdir()} if d.exists() else set()


@pytest.mark.long  # ~50 s; CI: integration/vmm/test_bad_input.py
def test_corrupt_snapshot_is_refused_and_an_intact_one_restores(node: NodeProcess) -> None:
    sbx = Sandbox.create(timeout=600)
    snaps: list[str] = []
    try:
        sbx.files.write("/home/user/mark.txt", "kept")
        bad = sbx.create_snapshot().snapshot_id
        snaps.append(bad)
        good = sbx.create_snapshot().snapshot_id
        snaps.append(good)
        for sid in (bad, good):  # computed in the background after the call returned
            _until(lambda sid=sid: (SNAPSHOTS / sid / CHECKSUMS_FILE).exists(), 180,
                   f"checksums of {sid}")

        memory = SNAPSHOTS / bad / "memory"
        with open(memory, "rb") as f:
            offset = os.lseek(f.fileno(), 0, os.SEEK_DATA) + 12345  # inside guest RAM data
        _flip(memory, offset)
        reason = _until(lambda: (SNAPSHOTS / bad / CORRUPT_FILE).exists()
                        and (SNAPSHOTS / bad / CORRUPT_FILE).read_text(), 300,
                        "the scrubber marking the damaged snapshot")
        assert "memory: chunk" in reason

        vms, qemus = _vm_entries(node), qemu_pids(node.env["AENV_INSTANCE"])
        with node.api() as c:
            r = c.post("/v2/sandboxes", json={"templateID": bad, "timeout": 60})
        assert r.status_code == 409, r.text
        body = r.json()
        assert body["code"] == 409 and body["error_code"] == "snapshot_corrupt", body
        assert bad in body["message"] and "memory: chunk" in body["message"]
        with pytest.raises(SandboxException, match="409: cannot restore"):
            Sandbox.create(template=bad, timeout=60)
        # The refused creates left nothing: no record, VM directory or VMM.
        listed = [s.sandbox_id for s in Sandbox.list().next_items()]
        assert listed == [sbx.sandbox_id]
        assert _vm_entries(node) == vms
        assert qemu_pids(node.env["AENV_INSTANCE"]) == qemus

        # The other snapshot of the same sandbox passed the same scrubs and restores.
        assert not (SNAPSHOTS / good / CORRUPT_FILE).exists()
        child = Sandbox.create(template=good, timeout=120)
        try:
            assert child.files.read("/home/user/mark.txt") == "kept"
        finally:
            child.kill()
    finally:
        sbx.kill()
        for sid in snaps:
            Sandbox.delete_snapshot(sid)
    assert not any((SNAPSHOTS / sid).exists() for sid in snaps)


def test_tampered_paused_state_is_refused_and_the_sandbox_stays_paused(
        node: NodeProcess) -> None:
    sbx = Sandbox.create(timeout=600)
    try:
        sbx.files.write("/home/user/kept.txt", "before pause")
        assert sbx.beta_pause() is True
        state = DATA_DIR / "sandboxes" / node.env["AENV_INSTANCE"] / sbx.sandbox_id / "state"
        _flip(state, 1000)
        with node.api() as c:
            r = c.post(f"/v2/sandboxes/{sbx.sandbox_id}/connect", json={"timeout": 60})
            assert r.status_code == 409, r.text
            assert r.json()["error_code"] == "snapshot_corrupt"
            assert "device state sha256" in r.json()["message"]
        assert sbx.get_info().state == SandboxState.PAUSED
        _flip(state, 1000)  # the same byte back: the check passes again
        same = Sandbox.connect(sbx.sandbox_id)
        assert same.files.read("/home/user/kept.txt") == "before pause"
    finally:
        sbx.kill()
