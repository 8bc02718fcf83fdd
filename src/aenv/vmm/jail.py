"""The one launcher every VMM process goes through (Firecracker-jailer style).

Under TCG, QEMU is not a security boundary, so aenv confines the QEMU process itself:
- its own numeric uid/gid from a reserved range (no /etc/passwd entry needed),
- its own mount, pid, ipc and uts namespaces (a fresh /proc shows only itself),
- an empty network namespace: its only link to the world is the tap fd it inherits,
- no capabilities (bounding and inheritable sets cleared, no_new_privs),
- a cgroup with memory, pids and cpu limits,
- and QEMU's own seccomp filter (`-sandbox on`, added by the driver).
Per-VM files are 0600 and owned by the jail uid; shared artifacts stay root-owned and
read-only, so a jail cannot open another VM's files.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from aenv.vmm.cgroup import Cgroup, Limits

KILL_GRACE = 2.0  # seconds for the launcher to reap a SIGKILLed VMM


@dataclass(frozen=True)
class JailSpec:
    name: str  # unique per VMM process; names its cgroup
    uid: int
    limits: Limits
    log_file: Path
    pass_fds: tuple[int, ...] = ()


def command(spec: JailSpec, argv: list[str]) -> list[str]:
    # --net: an empty network namespace; the VMM gets its tap as an inherited fd.
    return [
        "unshare", "--mount", "--pid", "--ipc", "--uts", "--net", "--fork", "--kill-child",
        "--mount-proc", "--",
        "setpriv", f"--reuid={spec.uid}", f"--regid={spec.uid}", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
        *argv,
    ]


@dataclass
class Jailed:
    """A running jailed process: `proc` is the launcher (unshare); the VMM is its child."""

    proc: asyncio.subprocess.Process
    cgroup: Cgroup

    def vmm_pid(self) -> int | None:
        """Host pid of the VMM (the jail's pid 1), or None if it is not there."""
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except FileNotFoundError:
            return None
        pids = children.split()
        return int(pids[0]) if pids else None

    async def kill(self) -> None:
        """End the VMM first, so the launcher reaps it and exits (killing the launcher
        first would leave the VMM a zombie for the host's init); then whatever is left."""
        if self.proc.returncode is None:
            pid = self.vmm_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                await asyncio.wait_for(self.proc.wait(), KILL_GRACE)
            except TimeoutError:
                self.cgroup.kill()
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        await asyncio.to_thread(self.cgroup.remove)


async def spawn(spec: JailSpec, argv: list[str]) -> Jailed:
    cgroup = Cgroup(spec.name)
    cgroup.create(spec.limits)
    log_fd = os.open(spec.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = await asyncio.create_subprocess_exec(
            *command(spec, argv),
            stdin=asyncio.subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
            pass_fds=spec.pass_fds,
            preexec_fn=cgroup.enter_self,  # the whole jail, launcher included, is limited
            start_new_session=True,  # a ^C to the node must not reach its VMs
        )
    except BaseException:
        cgroup.remove()
        raise
    finally:
        os.close(log_fd)
    return Jailed(proc, cgroup)
