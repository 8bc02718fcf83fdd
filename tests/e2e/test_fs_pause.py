"""Filesystem-only pause and reboot-resume with the unmodified `e2b` SDK on real VMs
(e2b-compat.md 2.3: `pause(keep_memory=False)` / `mode="filesystem"`, `connect(on_resume=
"reboot")`, `lifecycle.on_timeout.mode="filesystem"` = `autoPauseMemory: false`).

A reboot shows as a new `/proc/sys/kernel/random/boot_id`: a memory restore keeps the one
the guest had, a cold boot draws a new one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, SandboxState

from tests.support.host import DATA_DIR

from .conftest import NodeProcess, qemu_pids
from .test_pause_recovery import _cleanup, _in_background, _listed, _start

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
# A reboot-resume is a cold boot: ~10-20 s under TCG, far more on a host busy with other VMs;
# the SDK's default request timeout (60 s) is for calls that do not boot.
REBOOT = {"request_timeout": 300}


def _vm_dir(node: NodeProcess, sid: str) -> Path:
    # A sandbox restored into a pooled VMM is a symlink to the pool's directory.
    return (DATA_DIR / "sandboxes" / node.env["AENV_INSTANCE"] / sid).resolve()


def _files(node: NodeProcess, sid: str) -> set[str]:
    return {p.name for p in _vm_dir(node, sid).iterdir()}


def _pause_mode(node: NodeProcess, sid: str) -> str | None:
    with node.api() as c:
        return c.get(f"/sandboxes/{sid}").json().get("pauseMode")


def _sleepers(sbx: Sandbox) -> list[int]:
    return [p.pid for p in sbx.commands.list() if p.args[-1:] == ["sleep 600"]]


def _state(sbx: Sandbox) -> tuple[str, str, str]:
    """(boot id, sha256 of /tmp/blob, /home/user/note.txt) as the guest sees them."""
    boot_id = sbx.commands.run(BOOT_ID).stdout.strip()
    digest = sbx.commands.run("sha256sum /tmp/blob 2>&1 | cut -d' ' -f1").stdout.strip()
    note = sbx.commands.run("cat /home/user/note.txt 2>&1 || true").stdout
    return boot_id, digest, note


def _write_files(sbx: Sandbox, note: str) -> None:
    """Files written just before the pause: still in the guest's page cache (no sync)."""
    sbx.commands.run("head -c 3000000 /dev/urandom > /tmp/blob")
    sbx.files.write("/home/user/note.txt", note)


def test_filesystem_pause_keeps_only_the_disk_and_connect_reboots(node: NodeProcess) -> None:
    sbx = Sandbox.create(timeout=120, envs={"FOO": "bar"})
    sid = sbx.sandbox_id
    try:
        _write_files(sbx, "written just before the pause")
        sleeper = sbx.commands.run("sleep 600", background=True, timeout=0)
        assert _sleepers(sbx) == [sleeper.pid]
        boot_id, digest, note = _state(sbx)
        assert {"memory", "disk"} <= _files(node, sid)

        assert sbx.pause(keep_memory=False) is True
        assert sbx.pause(keep_memory=False) is False  # already paused: 409
        assert not sbx.is_running()
        assert sbx.get_info().state == SandboxState.PAUSED
        assert _pause_mode(node, sid) == "filesystem"
        files = _files(node, sid)
        # only the disk (and the paused-state manifest and marker): no RAM, no device state
        assert "disk" in files and "memory" not in files and "state" not in files, files
        vm = _vm_dir(node, sid)
        assert json.loads((vm / "pause.json").read_text()) == {"memory": False}
        assert (vm / "disk").stat().st_size > 0

        t0 = time.monotonic()
        same = Sandbox.connect(sid, timeout=120, **REBOOT)  # 201: resumed by reboot
        reboot_s = time.monotonic() - t0
        assert same.sandbox_id == sid and same.is_running()
        assert same._envd_access_token == sbx._envd_access_token
        new_boot_id, new_digest, new_note = _state(same)
        assert new_boot_id != boot_id  # a cold boot, not a restore
        assert (new_digest, new_note) == (digest, note)  # the pause flushed the page cache
        assert _sleepers(same) == []  # processes are gone
        assert same.commands.run("echo $FOO").stdout == "bar\n"  # env pushed at /init
        assert sbx.commands.run("echo old object").stdout == "old object\n"  # same token
        assert "pause.json" not in _files(node, sid) and "manifest.json" not in _files(node, sid)
        info = same.get_info()
        # endAt counts from after the boot
        assert info.end_at.timestamp() >= time.time() + 120 - reboot_s - 30
        print(f"reboot-resume took {reboot_s:.1f} s")

        # it pauses fully again like any sandbox, and a plain connect restores its memory
        same.commands.run("sleep 600", background=True, timeout=0)
        assert same.pause() is True and _pause_mode(node, sid) == "full"
        back = Sandbox.connect(sid)
        assert _state(back)[0] == new_boot_id and len(_sleepers(back)) == 1
    finally:
        sbx.kill()


def test_connect_with_reboot_discards_a_full_pause(node: NodeProcess) -> None:
    sbx = Sandbox.create(timeout=120)
    sid = sbx.sandbox_id
    try:
        _write_files(sbx, "synced before a full pause")
        sbx.commands.run("sync")  # a full pause leaves flushing to the guest: do it here
        sbx.commands.run("sleep 600", background=True, timeout=0)
        boot_id, digest, note = _state(sbx)
        assert sbx.pause(strict=True) is True  # a healthy guest passes the strict check
        assert {"memory", "state", "disk"} <= _files(node, sid)
        assert _pause_mode(node, sid) == "full"

        same = Sandbox.connect(sid, on_resume="reboot", **REBOOT)
        new_boot_id, new_digest, new_note = _state(same)
        assert new_boot_id != boot_id and (new_digest, new_note) == (digest, note)
        assert _sleepers(same) == []
        assert same._envd_access_token == sbx._envd_access_token
        assert same.commands.run("echo ok").stdout == "ok\n"
        # running: reboot is a no-op (200, nothing restarts)
        again = Sandbox.connect(sid, on_resume="reboot")
        assert _state(again)[0] == new_boot_id
    finally:
        sbx.kill()


def test_auto_pause_without_memory_pauses_filesystem_only(node: NodeProcess) -> None:
    sbx = Sandbox.create(timeout=120,
                         lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
    sid = sbx.sandbox_id
    try:
        _write_files(sbx, "written before the timeout")
        sbx.commands.run("sleep 600", background=True, timeout=0)
        boot_id, digest, note = _state(sbx)
        sbx.set_timeout(1)
        deadline = time.monotonic() + 120
        while sbx.get_info().state != SandboxState.PAUSED:
            assert time.monotonic() < deadline, "not auto-paused"
            time.sleep(0.5)
        assert _pause_mode(node, sid) == "filesystem"
        assert "memory" not in _files(node, sid) and "disk" in _files(node, sid)
        same = Sandbox.connect(sid, timeout=60, **REBOOT)
        new_boot_id, new_digest, new_note = _state(same)
        assert new_boot_id != boot_id and (new_digest, new_note) == (digest, note)
        assert _sleepers(same) == []
        assert same.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
    finally:
        sbx.kill()


def test_a_filesystem_only_snapshot_keeps_the_disk_and_creates_from_it_boot(
    node: NodeProcess,
) -> None:
    """`create_snapshot(mode="filesystem")`: the source keeps running with its processes;
    the snapshot holds the disk alone; a sandbox created from it cold-boots the source's
    files, with none of its processes or RAM (a tmpfs marker)."""
    sbx = Sandbox.create(timeout=300)
    child = None
    snap_id = None
    try:
        _write_files(sbx, "written just before the snapshot")
        sbx.files.write("/dev/shm/marker", "in RAM")  # tmpfs: only a memory state keeps it
        sleeper = sbx.commands.run("sleep 600", background=True, timeout=0)
        boot_id, digest, note = _state(sbx)

        snap = sbx.create_snapshot(mode="filesystem")
        snap_id = snap.snapshot_id
        stored = DATA_DIR / "snapshots" / snap_id
        assert sorted(p.name for p in stored.iterdir() if not p.name.startswith(".")) == [
            "disk", "manifest.json"]  # no RAM file, no device state
        assert json.loads((stored / "manifest.json").read_text())["memory"] is False
        # The source carries on: same boot, its process, its RAM.
        assert _state(sbx) == (boot_id, digest, note) and _sleepers(sbx) == [sleeper.pid]
        assert sbx.files.read("/dev/shm/marker") == "in RAM"
        assert snap_id in [s.snapshot_id for s in Sandbox.list_snapshots().next_items()]

        child = Sandbox.create(snap_id, timeout=300, envs={"WHO": "child"}, **REBOOT)
        assert child.sandbox_id != sbx.sandbox_id
        new_boot_id, new_digest, new_note = _state(child)
        assert new_boot_id != boot_id  # a cold boot
        assert (new_digest, new_note) == (digest, note)  # the snapshot flushed the guest
        assert _sleepers(child) == []
        assert child.commands.run("cat /dev/shm/marker 2>/dev/null || echo gone").stdout == "gone\n"
        assert child.commands.run("echo $WHO").stdout == "child\n"  # its own /init
        # The two diverge: neither sees the other's writes.
        child.files.write("/home/user/note.txt", "the child's")
        assert sbx.files.read("/home/user/note.txt") == note
    finally:
        if child is not None:
            child.kill()
        sbx.kill()
        if snap_id is not None:
            Sandbox.delete_snapshot(snap_id)


@pytest.mark.long  # ~45 s: waits for a stopped agent's timeouts
def test_a_guest_that_does_not_answer(node: NodeProcess) -> None:
    """strict: 503 and it keeps running; otherwise paused unflushed, and a reboot rescues it."""
    sbx = Sandbox.create(timeout=300)
    sid = sbx.sandbox_id
    try:
        sbx.files.write("/home/user/note.txt", "synced")
        sbx.commands.run("sync")
        # Stop the agent itself (the commands' parent): the guest runs, nothing answers.
        sbx.commands.run("sleep 1; kill -STOP $PPID", background=True, user="root", timeout=0)
        deadline = time.monotonic() + 120  # until it stopped answering (a busy host: later)
        while True:
            try:
                with httpx.Client(timeout=2) as probe:
                    probe.get(f"{node.origin}/health", headers={"E2b-Sandbox-Id": sid,
                                                                "E2b-Sandbox-Port": "49983"})
            except httpx.TimeoutException:
                break
            assert time.monotonic() < deadline, "the agent kept answering after SIGSTOP"
            time.sleep(0.5)
        with node.api() as c:  # raw HTTP: the SDK would retry a 503
            r = c.post(f"/sandboxes/{sid}/pause",
                       json={"memory": False, "requireHealthyGuest": True})
            assert r.status_code == 503, r.text
            assert c.get(f"/sandboxes/{sid}").json()["state"] == "running"
        assert sbx.pause(keep_memory=False) is True  # not strict: paused anyway
        assert _pause_mode(node, sid) == "filesystem"
        same = Sandbox.connect(sid, **REBOOT)
        assert same.files.read("/home/user/note.txt") == "synced"
        assert same.commands.run("echo alive").stdout == "alive\n"
    finally:
        sbx.kill()


@pytest.mark.long  # three node starts and a reboot
def test_a_filesystem_only_pause_survives_restarts_and_a_kill_9_mid_reboot(
    tmp_path: Path, instance: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _start(tmp_path, "a", instance, monkeypatch)
    try:
        sbx = Sandbox.create(timeout=300)
        sid = sbx.sandbox_id
        sbx.files.write("/home/user/note.txt", "across restarts")
        assert sbx.pause(keep_memory=False) is True
    finally:
        assert a.stop() == 0, a.tail()
    assert not qemu_pids(instance)

    b = _start(tmp_path, "b", instance, monkeypatch)
    try:
        assert _listed() == {sid: SandboxState.PAUSED}
        assert _pause_mode(b, sid) == "filesystem"
        # kill -9 of the node while it reboots the sandbox (a boot takes seconds)
        t = _in_background(lambda: Sandbox.connect(sid, **REBOOT))
        time.sleep(2)
    finally:
        b.kill9()
    t.join(30)

    c = _start(tmp_path, "c", instance, monkeypatch)
    try:
        state = _listed()[sid]
        if state is SandboxState.PAUSED:  # the reboot had not finished: its disk is intact
            assert _pause_mode(c, sid) == "filesystem"
            # (the RAM file of the interrupted boot goes at the next resume)
            assert json.loads((_vm_dir(c, sid) / "pause.json").read_text()) == {"memory": False}
        else:  # it had: the rebooted VM, which outlived the node, was re-adopted
            assert state is SandboxState.RUNNING
        same = Sandbox.connect(sid, **REBOOT)
        assert same.files.read("/home/user/note.txt") == "across restarts"
    finally:
        _cleanup(c, [])
