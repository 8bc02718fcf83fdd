"""The cgroup user processes share, so a fork bomb or a memory hog cannot take the agent
(or the guest) down.

Layout under the cgroup2 mount: ``<root>/aenv-user`` with ``pids.max`` and ``memory.max``
(guest RAM minus a reserve for the kernel and the agent). The agent stays in the root
cgroup and sets its own ``oom_score_adj`` to -1000; user processes get a positive score.
"""

from __future__ import annotations

import contextlib
import logging
import os

from .spawn import SpawnPolicy

log = logging.getLogger("aenv.guest.agent")

USER_CGROUP = "aenv-user"
USER_OOM_SCORE_ADJ = 100
# RAM kept out of the user cgroup's reach: the larger of 48 MiB and 1/8 of RAM.
MIN_RESERVE = 48 * 1024 * 1024


def default_memory_max(mem_total: int) -> int:
    return max(mem_total - max(MIN_RESERVE, mem_total // 8), 16 * 1024 * 1024)


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


def setup_user_cgroup(
    root: str, *, pids_max: int, memory_max: int | None, mem_total: int
) -> SpawnPolicy:
    """Create (or reuse) the user cgroup and return how to spawn into it.

    Falls back to no cgroup (logged) if cgroup2 is not usable there.
    """
    path = os.path.join(root, USER_CGROUP)
    try:
        if not os.path.exists(os.path.join(root, "cgroup.controllers")):
            raise OSError(f"{root} is not a cgroup2 mount")
        for controller in ("memory", "pids"):
            try:
                _write(os.path.join(root, "cgroup.subtree_control"), f"+{controller}")
            except OSError as e:
                log.warning("cannot enable the %s controller under %s: %s", controller, root, e)
        os.makedirs(path, exist_ok=True)
        limit = memory_max if memory_max is not None else default_memory_max(mem_total)
        with contextlib.suppress(FileNotFoundError):
            _write(os.path.join(path, "pids.max"), str(pids_max))
        with contextlib.suppress(FileNotFoundError):
            _write(os.path.join(path, "memory.max"), str(limit))
        with contextlib.suppress(FileNotFoundError):
            _write(os.path.join(path, "memory.swap.max"), "0")
    except OSError as e:
        log.warning("user cgroup disabled: %s", e)
        return SpawnPolicy()
    with contextlib.suppress(OSError):
        _write("/proc/self/oom_score_adj", "-1000")
    return SpawnPolicy(
        cgroup_procs=os.path.join(path, "cgroup.procs"), oom_score_adj=USER_OOM_SCORE_ADJ
    )
