"""Host-side helpers shared by the suites that start real nodes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

from aenv.vmm import ram
from aenv.vmm.memory import RamMapping

DATA_DIR = Path(os.environ.get("AENV_DATA_DIR", "/var/lib/aenv"))
STOP_DEADLINE_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def qemu_pids(instance: str | None = None, data_dir: Path = DATA_DIR) -> set[int]:
    """QEMU processes running a sandbox of this data directory (others' QEMUs don't count);
    with `instance`, only that node instance's (other nodes on the host may be booting)."""
    marker = str(data_dir / "sandboxes" / (instance or "")).rstrip("/").encode()
    marker += b"/" if instance else b""
    return qemu_pids_with(marker)


def qemu_pids_with(marker: bytes) -> set[int]:
    """QEMU processes with `marker` in one of their arguments (e.g. their VM directory)."""
    pids = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"qemu-system" in argv[0] and any(marker in a for a in argv):
            pids.add(int(p.name))
    return pids


class ServerProcess:
    """Stopping and reading an `aenv server` child; the class using it has `proc` and `log`."""

    proc: subprocess.Popen[bytes] | None
    log: Path

    def stop(self) -> int:
        """SIGTERM, then its exit code; a node that ignores SIGTERM fails the test."""
        import pytest

        assert self.proc is not None
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.kill9()
            pytest.fail(f"aenv server ignored SIGTERM for {STOP_DEADLINE_S} s:\n{self.tail()}")

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def vmm_of(instance: str, sandbox_id: str, data_dir: Path = DATA_DIR) -> RamMapping | None:
    """The QEMU that maps this sandbox's RAM file, with where (None if no QEMU does). Its
    directory may be a pooled VM's, reached through a symlink."""
    vm_dir = (data_dir / "sandboxes" / instance / sandbox_id).resolve()
    # By its directory on the command line: VMs of one template map one RAM file.
    for pid in qemu_pids_with(str(vm_dir).encode() + b"/"):
        try:
            return ram.mapping(pid, vm_dir / "memory")
        except OSError:
            continue
    return None


def guest_ram(instance: str, sandbox_id: str, data_dir: Path = DATA_DIR) -> bytes:
    """The running sandbox's guest RAM as its VMM sees it (its written pages are its own
    anonymous memory until a save: not in any file), read through /proc/<pid>/mem."""
    vmm = vmm_of(instance, sandbox_id, data_dir)
    assert vmm is not None, f"no VMM runs {sandbox_id}"
    with open(f"/proc/{vmm.pid}/mem", "rb", buffering=0) as f:
        f.seek(vmm.start)
        return f.read(vmm.end - vmm.start)


# The registries test nodes may pull from: the public ones (docker.io comes from a loopback
# mirror in the tests that use it) and the tests' own registries on loopback.
TEST_IMAGE_REGISTRIES = "docker.io,ghcr.io,127.0.0.1"
