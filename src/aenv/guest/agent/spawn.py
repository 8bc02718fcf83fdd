"""Starting a user process: credentials, session, controlling TTY, cgroup, OOM score.

The steps a child takes before its command, in order: join the cgroup, set the OOM score
and nice value, TIOCSCTTY, then drop to the user.

- In the guest they are done by the tools drive's static ``aenv-exec`` helper, which the
  agent starts with vfork: forking the agent itself costs 50-70 ms under TCG, since the
  child copies its page tables and either side then takes copy-on-write faults.
- Without the helper (the agent on a host, in tests), CPython's C ``fork_exec`` does what
  it can (setsid, setgroups, setgid, setuid) and a small ``preexec_fn`` the rest.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import termios
from collections.abc import Callable
from dataclasses import dataclass

from .users import User


@dataclass(frozen=True, slots=True)
class SpawnPolicy:
    """Where and how user processes are placed (fixed for the agent's lifetime)."""

    # ``<cgroup>/cgroup.procs`` of the cgroup for non-root users, or None.
    cgroup_procs: str | None = None
    # The same for processes started as root.
    root_cgroup_procs: str | None = None
    # Written to the child's /proc/self/oom_score_adj (the agent itself runs at -1000).
    oom_score_adj: int | None = None
    # The child's nice value (the agent itself runs at a negative one).
    nice: int | None = None
    # The static aenv-exec helper, if present (see the module docstring).
    exec_helper: str | None = None

    @property
    def has_child_steps(self) -> bool:
        return (
            self.cgroup_procs is not None
            or self.root_cgroup_procs is not None
            or self.oom_score_adj is not None
            or self.nice is not None
        )


def _preexec(
    policy: SpawnPolicy,
    ctty: bool,
    creds: tuple[int, int, tuple[int, ...]] | None,
    cgroup_procs: str | None,
) -> Callable[[], None]:
    oom = None if policy.oom_score_adj is None else str(policy.oom_score_adj).encode()
    nice = policy.nice

    def child() -> None:  # runs in the forked child, after setsid()
        if cgroup_procs is not None:
            try:
                fd = os.open(cgroup_procs, os.O_WRONLY)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)
            except OSError:
                pass
        if oom is not None:
            try:
                fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
                try:
                    os.write(fd, oom)
                finally:
                    os.close(fd)
            except OSError:
                pass
        if nice is not None:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        if ctty:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if creds is not None:
            uid, gid, groups = creds
            os.setgroups(list(groups))
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)

    return child


def spawn(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str,
    user: User,
    stdin: int,
    stdout: int,
    stderr: int,
    policy: SpawnPolicy,
    ctty: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` as ``user`` in a new session.

    Raises OSError if the command cannot be executed, SubprocessError if a step before it
    failed.
    """
    switch = user.uid != os.geteuid() or user.gid != os.getegid()
    creds = (user.uid, user.gid, user.groups) if switch else None
    cgroup_procs = policy.root_cgroup_procs if user.uid == 0 else policy.cgroup_procs
    needs_child_code = ctty or policy.has_child_steps
    if policy.exec_helper is not None and (needs_child_code or switch):
        return _spawn_with_helper(
            policy.exec_helper,
            _helper_flags(policy, ctty, creds, cgroup_procs),
            argv,
            env=env,
            cwd=cwd,
            stdio=(stdin, stdout, stderr),
        )
    kwargs: dict[str, object] = {}
    if needs_child_code:
        kwargs["preexec_fn"] = _preexec(policy, ctty, creds, cgroup_procs)
    elif creds is not None:
        kwargs.update(user=user.uid, group=user.gid, extra_groups=list(user.groups))
    return subprocess.Popen(
        argv,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=cwd,
        env=env,
        start_new_session=True,
        close_fds=True,
        **kwargs,  # type: ignore[arg-type]
    )


def _helper_flags(
    policy: SpawnPolicy,
    ctty: bool,
    creds: tuple[int, int, tuple[int, ...]] | None,
    cgroup_procs: str | None,
) -> list[str]:
    flags: list[str] = []
    if cgroup_procs is not None:
        flags += ["-c", cgroup_procs]
    if policy.oom_score_adj is not None:
        flags += ["-o", str(policy.oom_score_adj)]
    if policy.nice is not None:
        flags += ["-n", str(policy.nice)]
    if ctty:
        flags.append("-t")
    if creds is not None:
        uid, gid, groups = creds
        flags += ["-u", str(uid), "-g", str(gid)]
        if groups:
            flags += ["-G", ",".join(map(str, groups))]
    return flags


def _spawn_with_helper(
    helper: str,
    flags: list[str],
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str,
    stdio: tuple[int, int, int],
) -> subprocess.Popen[bytes]:
    report_r, report_w = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            popen = subprocess.Popen(
                [helper, "-e", str(report_w), *flags, "--", *argv],
                stdin=stdio[0],
                stdout=stdio[1],
                stderr=stdio[2],
                cwd=cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
                pass_fds=(report_w,),
            )
        finally:
            os.close(report_w)
        # EOF as soon as the helper has executed the command (the pipe is close-on-exec
        # there): a few syscalls after the vfork returned.
        report = _read_to_eof(report_r)
    finally:
        os.close(report_r)
    if not report:
        return popen
    popen.wait()
    step, _, code = report.decode(errors="replace").partition(":")
    err = int(code) if code.isdigit() else 0
    if step == "exec":
        raise OSError(err, os.strerror(err), argv[0])
    raise subprocess.SubprocessError(f"{step} failed before exec: {os.strerror(err)}")


def _read_to_eof(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 256):
        chunks.append(chunk)
    return b"".join(chunks)
