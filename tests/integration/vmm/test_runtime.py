"""The runtime end to end on real QEMU microVMs: template restore, isolation, jail, cleanup."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from aenv.machines.api import AgentInit, TemplateNotFound
from tests.support import envd_client

pytestmark = pytest.mark.vm


async def _run(handle, cmd: str, token: str | None = None):
    return await asyncio.to_thread(envd_client.run, handle.url(), cmd, token)


def _status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        out[k] = v.strip()
    return out


def _largest_mapping_flags(pid: int) -> list[str]:
    """VmFlags of the process's largest mapping (a VMM's: guest RAM)."""
    best, size, flags = -1, 0, []
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if line.startswith("Size:"):
            size = int(line.split()[1])
        elif line.startswith("VmFlags:") and size > best:
            best, flags = size, line.split()[1:]
    return flags


def _assert_released(runtime, name: str, slot, vmm_pid: int) -> None:
    assert name not in runtime.machines()
    assert not Path(f"/proc/{vmm_pid}").exists(), "QEMU still running"
    assert not (runtime.cfg.sandboxes_dir / name).exists(), "VM directory left behind"
    assert all(not d.exists() for d in runtime.cgroup(name).dirs.values()), "cgroup left"
    assert not runtime.slots.holds(slot), "slot not released"


async def test_base_restores_and_runs_a_command(runtime, sandbox_id):
    h = await runtime.create(sandbox_id, "base", AgentInit(access_token="tok", env_vars={"A": "1"}))
    try:
        code, out, _ = await _run(h, "echo hi $A; id -un; cat /etc/debian_version", "tok")
        assert code == 0
        lines = out.splitlines()
        assert lines[0] == "hi 1"
        assert lines[1] == "user"
        assert lines[2].startswith("12.")
        # the guest kernel has what the agent needs
        code, out, _ = await _run(
            h, "grep -c cgroup2 /proc/filesystems; test -c /dev/ptmx && echo pty; "
               "python3 -c 'import select; select.epoll(); print(\"epoll\")'; "
               "cat /proc/sys/fs/inotify/max_user_watches >/dev/null && echo inotify", "tok")
        assert code == 0 and out.split() == ["1", "pty", "epoll", "inotify"]
    finally:
        await runtime.kill(h)


async def test_each_qemu_is_jailed(runtime, sandbox_id):
    h = await runtime.create(sandbox_id, "base", AgentInit())
    h2 = await runtime.create(sandbox_id + "b", "base", AgentInit())
    try:
        st, st2 = _status(h.vmm_pid), _status(h2.vmm_pid)
        assert st["Name"].startswith("qemu-system")
        assert st["CapEff"] == "0000000000000000"
        assert st["CapBnd"] == "0000000000000000"
        assert st["Seccomp"] == "2"
        assert st["NoNewPrivs"] == "1"
        uid = int(st["Uid"].split()[0])
        assert uid >= runtime.cfg.jail_uid_base
        assert int(st2["Uid"].split()[0]) != uid, "two VMs share a uid"
        # own pid namespace: QEMU is pid 1 in it
        assert st["NSpid"].split()[-1] == "1"
        p = runtime.cfg.sandboxes_dir / sandbox_id / "disk"
        assert p.stat().st_uid == uid and (p.stat().st_mode & 0o777) == 0o600
        # Its RAM file is the template's own (one inode: one page cache), root's, read-only,
        # mapped private (vmm/ram.py).
        mem = (runtime.cfg.sandboxes_dir / sandbox_id / "memory").stat()
        tmpl = runtime.snapshots.path(runtime.catalog.get("base").snapshot_id) / "memory"
        assert mem.st_ino == tmpl.stat().st_ino
        assert mem.st_uid == 0 and (mem.st_mode & 0o777) == 0o444
        # the jail's seccomp filter kept QEMU's MADV_HUGEPAGE off guest RAM (aenv.vmm.seccomp)
        ram = _largest_mapping_flags(h.vmm_pid)
        assert "sh" not in ram and "hg" not in ram, ram
        # a jail cannot open another VM's files
        other = runtime.cfg.sandboxes_dir / (sandbox_id + "b") / "disk"
        r = subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "cat", str(other)],
            capture_output=True, text=True)
        assert r.returncode != 0 and "Permission denied" in r.stderr
    finally:
        await runtime.kill(h)
        await runtime.kill(h2)


async def test_sandboxes_share_template_extents_not_writes(runtime, sandbox_id):
    a = await runtime.create(sandbox_id + "a", "base", AgentInit())
    b = await runtime.create(sandbox_id + "b", "base", AgentInit())
    try:
        assert a.slot_addr != b.slot_addr  # different slots; both answered their first /init
        disk = runtime.cfg.sandboxes_dir / (sandbox_id + "a") / "disk"
        frag = subprocess.run(["filefrag", "-v", str(disk)], capture_output=True, text=True)
        assert "shared" in frag.stdout, "disk is not a reflink clone of the template"
        assert (await _run(a, "echo only-a > /home/user/f && sync"))[0] == 0
        code, out, _ = await _run(b, "cat /home/user/f 2>&1 || echo missing")
        assert out.strip().endswith("missing")
        # the guests cannot reach each other, nor the host side of their slots
        probe = ("python3 - <<'E'\nimport socket,sys\nfor h in sys.argv[1:] or %r:\n"
                 " s=socket.socket(); s.settimeout(1)\n"
                 " try: s.connect((h,49983)); print('open',h)\n"
                 " except OSError: print('closed',h)\nE")
        targets = [b.slot_addr, runtime.machines()[sandbox_id + "b"].slot.host_addr,
                   runtime.machines()[sandbox_id + "a"].slot.host_addr]
        code, out, _ = await _run(a, probe % (targets,))
        assert out.split().count("closed") == len(targets), out
    finally:
        await runtime.kill(a)
        await runtime.kill(b)


async def test_busybox_only_template_agent_answers(runtime, busybox_template, sandbox_id):
    h = await runtime.create(sandbox_id, "busybox", AgentInit(default_user="root"))
    try:
        r = httpx.get(h.url() + "/health", timeout=5)
        assert r.status_code == 204
        code, out, _ = await _run(h, "busybox | head -1; ls /usr/bin/python3 2>&1 || true")
        assert code == 0 and "BusyBox" in out and "No such file" in out
    finally:
        await runtime.kill(h)


async def test_kill_releases_everything(runtime, sandbox_id):
    h = await runtime.create(sandbox_id, "base", AgentInit())
    slot = runtime.machines()[sandbox_id].slot
    await runtime.kill(h)
    _assert_released(runtime, sandbox_id, slot, h.vmm_pid)
    await runtime.kill(h)  # idempotent


async def test_unknown_template_is_a_clear_error(runtime, sandbox_id):
    with pytest.raises(TemplateNotFound):
        await runtime.create(sandbox_id, "no-such-template", AgentInit())
    assert sandbox_id not in runtime.machines()
    assert not (runtime.cfg.sandboxes_dir / sandbox_id).exists()


async def test_qemu_dying_at_start_leaves_nothing(runtime, sandbox_id, tmp_path, monkeypatch):
    monkeypatch.setattr(runtime._pool, "take", lambda key: None)  # force a fresh QEMU
    real = runtime.driver.binary
    fake = tmp_path / "qemu"
    fake.write_text("#!/bin/sh\necho 'qemu: simulated failure' >&2\nexit 1\n")
    fake.chmod(0o755)
    os.chmod(tmp_path, 0o755)
    runtime.driver.binary = str(fake)
    try:
        with pytest.raises(Exception, match="QEMU exited at start"):
            await runtime.create(sandbox_id, "base", AgentInit())
    finally:
        runtime.driver.binary = real
    assert sandbox_id not in runtime.machines()
    assert not (runtime.cfg.sandboxes_dir / sandbox_id).exists()
    assert all(not d.exists() for d in runtime.cgroup(sandbox_id).dirs.values())
