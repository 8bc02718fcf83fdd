"""Starting a user process: credentials, session, controlling TTY, cgroup, OOM score.

The fast path (no cgroup, no PTY) lets CPython's C ``fork_exec`` do everything (setsid,
setgroups, setgid, setuid). When the child must join the user cgroup before dropping
privileges, or acquire a controlling terminal, a small ``preexec_fn`` does those steps in
the child, in this order: join cgroup, set OOM score and nice, TIOCSCTTY, then drop to the
user.
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
    """Fork and exec ``argv`` as ``user`` in a new session. Raises OSError on failure."""
    switch = user.uid != os.geteuid() or user.gid != os.getegid()
    needs_child_code = ctty or policy != SpawnPolicy()
    kwargs: dict[str, object] = {}
    if needs_child_code:
        creds = (user.uid, user.gid, user.groups) if switch else None
        cgroup_procs = policy.root_cgroup_procs if user.uid == 0 else policy.cgroup_procs
        kwargs["preexec_fn"] = _preexec(policy, ctty, creds, cgroup_procs)
    elif switch:
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
