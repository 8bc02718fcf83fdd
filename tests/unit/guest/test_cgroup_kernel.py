"""User cgroup set-up against a fake cgroup2 directory; entropy ioctl packing."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from aenv.guest.agent import cgroup, kernel


def test_setup_user_cgroup_writes_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    sandbox = tmp_path / cgroup.SANDBOX_CGROUP
    sandbox.mkdir()
    for f in ("pids.max", "memory.max", "memory.swap.max"):
        (sandbox / f).write_text("max\n")
    writes: list[tuple[str, str]] = []
    real_write = cgroup._write

    def record(path: str, value: str) -> None:
        writes.append((path, value))
        if not path.startswith("/proc/"):
            real_write(path, value)

    monkeypatch.setattr(cgroup, "_write", record)
    monkeypatch.setattr(cgroup.os, "setpriority", lambda *a: writes.append(("nice", str(a))))
    policy = cgroup.setup_user_cgroup(
        str(tmp_path), pids_max=123, memory_max=None, mem_total=1024 << 20
    )
    assert policy.cgroup_procs == str(sandbox / "user" / "cgroup.procs")
    assert policy.root_cgroup_procs == str(sandbox / "root" / "cgroup.procs")
    assert policy.oom_score_adj == cgroup.USER_OOM_SCORE_ADJ and policy.nice == 0
    assert (sandbox / "pids.max").read_text() == "123"
    assert int((sandbox / "memory.max").read_text()) == (1024 - 128) << 20
    assert (sandbox / "memory.swap.max").read_text() == "0"
    for d in (tmp_path, sandbox):
        assert (str(d / "cgroup.subtree_control"), "+pids") in writes
        assert (str(d / "cgroup.subtree_control"), "+cpu") in writes
    assert ("/proc/self/oom_score_adj", "-1000") in writes
    assert any(w[0] == "nice" for w in writes)


def test_no_cgroup2_means_no_policy(tmp_path: Path) -> None:
    policy = cgroup.setup_user_cgroup(str(tmp_path), pids_max=1, memory_max=None, mem_total=0)
    assert policy.cgroup_procs is None and policy.oom_score_adj is None


def test_memory_reserve() -> None:
    assert cgroup.default_memory_max(256 << 20) == (256 - 48) << 20
    assert cgroup.default_memory_max(4096 << 20) == 4096 * 7 // 8 << 20


def test_entropy_ioctl_payload(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[tuple[int, bytes | None]] = []
    monkeypatch.setattr(kernel.fcntl, "ioctl", lambda fd, req, arg=None: calls.append((req, arg)))
    dev = tmp_path / "random"
    dev.write_bytes(b"")
    kernel.add_entropy(b"\x01" * 63, str(dev))
    (req1, arg1), (req2, _arg2) = calls
    assert (req1, req2) == (kernel.RNDADDENTROPY, kernel.RNDRESEEDCRNG)
    assert struct.unpack("ii", arg1[:8]) == (63 * 8, 63)
    assert arg1[8:] == b"\x01" * 63 + b"\0"
