"""The one launcher every VMM process goes through (Firecracker-jailer style).

Under TCG, QEMU is not a security boundary, so aenv confines the QEMU process itself:
- its own numeric uid/gid from a reserved range (no /etc/passwd entry needed),
- its own mount, pid, ipc and uts namespaces (a fresh /proc shows only itself), the mount
  namespace rooted in a minimal read-only tmpfs: /usr, the loader cache, a few devices, the
  shared artifacts it reads (read-only) and its own directory (`aenv.vmm.jailroot`),
- an environment with nothing but PATH (none of the node's variables, e.g. an API key),
- an empty network namespace: its only link to the world is the tap fd it inherits,
- no capabilities (bounding and inheritable sets cleared, no_new_privs),
- a cgroup with memory, pids and cpu limits,
- a seccomp filter that turns madvise(MADV_HUGEPAGE) into a no-op (`aenv.vmm.seccomp`: why),
- and QEMU's own seccomp filter (`-sandbox on`, added by the driver).
Per-VM files are 0600 and owned by the jail uid; shared artifacts stay root-owned and
read-only, so a jail cannot open another VM's files.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import select
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aenv.vmm import jailroot, seccomp
from aenv.vmm.cgroup import Cgroup, Limits
from aenv.vmm.jailroot import RootSpec

KILL_GRACE = 2.0  # seconds for the launcher to reap a SIGKILLed VMM


@dataclass(frozen=True)
class JailSpec:
    name: str  # unique per VMM process; names its cgroup
    uid: int
    limits: Limits
    log_file: Path
    pass_fds: tuple[int, ...] = ()
    # What the jail's filesystem holds besides the system part.
    root: RootSpec = dataclasses.field(default_factory=RootSpec)
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # besides JAIL_ENV


# The jail's whole environment: the node's own (which may hold secrets) is not passed on.
JAIL_ENV = {"PATH": "/usr/sbin:/usr/bin",
            # One malloc arena for all of QEMU's threads: ~4 MiB less a VMM, no slower.
            "GLIBC_TUNABLES": "glibc.malloc.arena_max=1"}


def command(spec: JailSpec, argv: list[str], root_fd: int) -> list[str]:
    """The launcher's argv; root_fd is an inherited fd of the jail's mount namespace
    (`jailroot.prepare`). nsenter enters it (landing in its minimal root) and execs unshare,
    so the launcher is one process whose only child is the VMM."""
    # --net: an empty network namespace; the VMM gets its tap as an inherited fd.
    # --mount-proc: a /proc of the jail's own pid namespace, in a nested copy of its root.
    return [
        "nsenter", f"--mount=/proc/self/fd/{root_fd}", "--",
        "unshare", "--mount", "--pid", "--ipc", "--uts", "--net", "--fork", "--kill-child",
        "--mount-proc", "--",
        "setpriv", f"--reuid={spec.uid}", f"--regid={spec.uid}", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
        *argv,
    ]


class Process(Protocol):
    """The launcher process as `Jailed` uses it: our child, or an adopted one (pidfds)."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def kill(self) -> None: ...


UNKNOWN_STATUS = -1  # an adopted launcher is not our child: its exit status is not ours to read
# util-linux 2.38's unshare cannot pass on a SIGKILL (its `signal(SIGKILL, SIG_DFL)` fails):
# it exits 1 and says this on its stderr, the VMM's log, instead.
_UNSHARE_LOST_SIGKILL = "unshare: sigprocmask unblock failed"


def vmm_returncode(launcher_returncode: int, log_tail: str) -> int:
    """The VMM's status (asyncio's convention: negative = the signal that ended it) from its
    launcher's: unshare exits with the VMM's exit code, or dies by the VMM's signal."""
    lines = log_tail.strip().splitlines()
    if launcher_returncode == 1 and lines and lines[-1].startswith(_UNSHARE_LOST_SIGKILL):
        return -signal.SIGKILL
    return launcher_returncode


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot, /proc/<pid>/stat field 22): with
    the pid, an identity that a reused pid does not share. None if there is no such pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    return int(stat[stat.rindex(")") + 2:].split()[19])


def _uids(pid: int) -> set[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return {int(u) for u in line.split()[1:]}
    return set()


class PidfdProcess:
    """A launcher watched through a pidfd, which stays bound to this very process even if
    its pid is reused: signals go to it alone, and the fd turns readable when it exits. Any
    number of callers may wait at once (the node's exit watcher and a kill): they share one
    future. `popen`: our own child, reaped when it exits (its status is then known)."""

    def __init__(self, pid: int, pidfd: int, popen: subprocess.Popen[bytes] | None = None,
                 ) -> None:  # fmt: skip
        self.pid = pid
        self._fd: int | None = pidfd
        self._done: asyncio.Future[None] | None = None  # resolved when the fd is closed
        self._loop: asyncio.AbstractEventLoop | None = None  # watching the fd, if any
        self._popen = popen
        self._status = UNKNOWN_STATUS

    def _exited(self) -> bool:
        if self._fd is None:
            return True
        p = select.poll()
        p.register(self._fd, select.POLLIN)
        if not p.poll(0):
            return False
        if self._popen is not None:
            self._status = self._popen.wait()  # it has exited: no wait
        self.close()
        return True

    @property
    def returncode(self) -> int | None:
        return self._status if self._exited() else None

    async def wait(self) -> int:
        if self._exited():
            return self._status
        assert self._fd is not None
        if self._done is None:
            # One reader for every waiter: a second add_reader on the fd would replace the
            # first, and the fd must leave the loop before it is closed (its number may be
            # reused at once).
            self._loop = asyncio.get_running_loop()
            self._done = self._loop.create_future()
            self._loop.add_reader(self._fd, self._exited)
        await asyncio.shield(self._done)
        return self._status

    def kill(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)

    def close(self) -> None:
        """Let go of the process (not adopted after all, or it has exited): the fd goes,
        waiters return; a process still running keeps running."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(fd)
        os.close(fd)
        if self._done is not None and not self._done.done():
            self._done.set_result(None)


class AdoptedProcess(PidfdProcess):
    """A launcher an earlier node process started and that outlived it (start_new_session):
    not our child, so its exit status is not ours to read (a zombie waiting for the host's
    init counts as exited)."""

    @classmethod
    def attach(cls, pid: int, started: int) -> AdoptedProcess | None:
        """The process `pid` if it still runs and is the one that started at `started`
        (not a zombie, not a reuse of its pid), else None."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        proc = cls(pid, fd)
        # Checked after opening the fd: the fd now pins the process this start time names.
        if start_time(pid) != started or proc._exited():
            proc.close()
            return None
        return proc


@dataclass(frozen=True)
class JailIdentity:
    """Which processes a jail is, as persisted for a later node process to adopt it: pids
    with their start times (a pid alone may have been reused)."""

    launcher_pid: int
    launcher_started: int
    vmm_pid: int
    vmm_started: int


@dataclass
class Jailed:
    """A running jailed process: `proc` is the launcher (unshare); the VMM is its child."""

    proc: Process
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

    def identity(self) -> JailIdentity:
        vmm = self.vmm_pid()
        launcher_started = start_time(self.proc.pid)
        vmm_started = start_time(vmm) if vmm is not None else None
        if vmm is None or launcher_started is None or vmm_started is None:
            raise ProcessLookupError(f"jail {self.cgroup.name} has no running VMM")
        return JailIdentity(self.proc.pid, launcher_started, vmm, vmm_started)


async def spawn(spec: JailSpec, argv: list[str]) -> Jailed:
    """Start argv jailed. Paths in argv must be in spec.root (or under /usr): nothing else
    of the host's filesystem exists in the jail."""
    seccomp.prepare()  # built here: the forked child must only make the prctl call
    cgroup = Cgroup(spec.name)
    cgroup.create(spec.limits)
    try:
        root_fd = await asyncio.to_thread(jailroot.prepare, _with_program(spec.root, argv))
    except BaseException:
        cgroup.remove()
        raise
    log_fd = -1
    try:
        log_fd = os.open(spec.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        popen = functools.partial(
            subprocess.Popen, command(spec, argv, root_fd),
            stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd,
            pass_fds=(*spec.pass_fds, root_fd), env={**spec.env, **JAIL_ENV},
            preexec_fn=functools.partial(_enter, cgroup),
            start_new_session=True,  # a ^C to the node must not reach its VMs
        )  # fmt: skip
        proc = await _start(popen)
    except BaseException:
        cgroup.remove()
        raise
    finally:
        os.close(root_fd)  # the launcher holds the namespace from here on
        if log_fd >= 0:
            os.close(log_fd)
    return Jailed(proc, cgroup)


# Launchers start on threads of their own: behind the node's other blocking work (file
# copies, removals, memory reads) in the default executor, a burst's restores would queue.
_STARTS = ThreadPoolExecutor(4, thread_name_prefix="aenv-vmm-start")


async def _start(popen: Callable[[], subprocess.Popen[bytes]]) -> PidfdProcess:
    """Start the launcher from a thread: Popen waits until the child has run `_enter` and
    exec'd, which under load (16 forks of 4 on 2 cores) held the event loop for seconds. If
    the caller is cancelled meanwhile, the launcher is ended once it has started; not before
    the fork: the caller closes the fds it passes once this returns."""
    started = asyncio.get_running_loop().run_in_executor(_STARTS, popen)
    try:
        child = await asyncio.shield(started)
    except asyncio.CancelledError:
        await asyncio.wait({started})
        _end_unwanted(started)
        raise
    return PidfdProcess(child.pid, os.pidfd_open(child.pid), child)


def _end_unwanted(started: asyncio.Future[subprocess.Popen[bytes]]) -> None:
    if started.cancelled() or started.exception() is not None:
        return
    child = started.result()
    with contextlib.suppress(ProcessLookupError):
        child.kill()
    threading.Thread(target=child.wait, name="aenv-reap", daemon=True).start()


def _enter(cgroup: Cgroup) -> None:
    """In the forked launcher, before exec: the whole jail, launcher included, is limited
    by its cgroup and carries the seccomp filter (see aenv.vmm.seccomp)."""
    cgroup.enter_self()
    seccomp.install()


def _with_program(root: RootSpec, argv: list[str]) -> RootSpec:
    """A program given by an absolute path outside /usr (e.g. a test's stand-in for QEMU)
    is bound read-only too, so it can be executed."""
    program = Path(argv[0])
    if not program.is_absolute() or jailroot.SYSTEM in program.parents:
        return root
    return dataclasses.replace(root, ro_paths=(*root.ro_paths, program))


def adopt(name: str, ident: JailIdentity, uid: int) -> Jailed | None:
    """Re-attach to the jail `name` an earlier node process spawned, if `ident` still names
    its live processes: the launcher and the VMM (its only child, running as `uid`) are the
    processes that started then, and both are in the jail's cgroup. None otherwise; nothing
    is killed here (reclaiming a jail is by its cgroup)."""
    cgroup = Cgroup(name)
    members = cgroup.pids()
    if not {ident.launcher_pid, ident.vmm_pid} <= members:
        return None
    proc = AdoptedProcess.attach(ident.launcher_pid, ident.launcher_started)
    if proc is None:
        return None
    jailed = Jailed(proc, cgroup)
    try:
        ok = (jailed.vmm_pid() == ident.vmm_pid
              and start_time(ident.vmm_pid) == ident.vmm_started
              and _uids(ident.vmm_pid) == {uid})  # fmt: skip
    except (FileNotFoundError, ProcessLookupError):
        ok = False
    if not ok:
        proc.close()
        return None
    return jailed
