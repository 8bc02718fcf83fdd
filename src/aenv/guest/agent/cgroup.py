"""The cgroup user processes share, so a fork bomb or a memory hog cannot take the agent
(or the guest) down.

Layout under the cgroup2 mount::

    aenv-sandbox/          pids.max, memory.max (RAM minus a reserve), swap off
        user/              processes of every non-root user
        root/              processes started as root

The limits sit on ``aenv-sandbox``, so together all user processes never exceed them.
The two leaves compete for CPU as two entities (cpu controller on), so a fork bomb run by
``user`` cannot starve a root command sent to clean it up (``cgroup.kill``). The agent
stays in the root cgroup at nice -10 with ``oom_score_adj`` -1000; user processes get
nice 0 and a positive OOM score, so the OOM killer picks them, never the agent.
"""

from __future__ import annotations

import contextlib
import logging
import os

from .spawn import SpawnPolicy

log = logging.getLogger("aenv.guest.agent")

SANDBOX_CGROUP = "aenv-sandbox"
USER_LEAF = "user"
ROOT_LEAF = "root"
CONTROLLERS = ("memory", "pids", "cpu")
USER_OOM_SCORE_ADJ = 100
AGENT_NICE = -10
USER_NICE = 0
# RAM kept out of the user processes' reach: the larger of 48 MiB and 1/8 of RAM.
MIN_RESERVE = 48 * 1024 * 1024


def default_memory_max(mem_total: int) -> int:
    return max(mem_total - max(MIN_RESERVE, mem_total // 8), 16 * 1024 * 1024)


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(value)


def _enable_controllers(cgroup: str) -> None:
    for controller in CONTROLLERS:
        try:
            _write(os.path.join(cgroup, "cgroup.subtree_control"), f"+{controller}")
        except OSError as e:
            log.warning("cannot enable the %s controller under %s: %s", controller, cgroup, e)


def setup_user_cgroup(
    root: str, *, pids_max: int, memory_max: int | None, mem_total: int
) -> SpawnPolicy:
    """Create (or reuse) the sandbox cgroups and return how to spawn into them.

    Falls back to no cgroup (logged) if cgroup2 is not usable under ``root``.
    """
    sandbox = os.path.join(root, SANDBOX_CGROUP)
    try:
        if not os.path.exists(os.path.join(root, "cgroup.controllers")):
            raise OSError(f"{root} is not a cgroup2 mount")
        _enable_controllers(root)
        os.makedirs(sandbox, exist_ok=True)
        limit = memory_max if memory_max is not None else default_memory_max(mem_total)
        for name, value in (("pids.max", pids_max), ("memory.max", limit), ("memory.swap.max", 0)):
            with contextlib.suppress(FileNotFoundError):
                _write(os.path.join(sandbox, name), str(value))
        _enable_controllers(sandbox)
        for leaf in (USER_LEAF, ROOT_LEAF):
            os.makedirs(os.path.join(sandbox, leaf), exist_ok=True)
    except OSError as e:
        log.warning("user cgroup disabled: %s", e)
        return SpawnPolicy()
    with contextlib.suppress(OSError):
        _write("/proc/self/oom_score_adj", "-1000")
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, AGENT_NICE)
    return SpawnPolicy(
        cgroup_procs=os.path.join(sandbox, USER_LEAF, "cgroup.procs"),
        root_cgroup_procs=os.path.join(sandbox, ROOT_LEAF, "cgroup.procs"),
        oom_score_adj=USER_OOM_SCORE_ADJ,
        nice=USER_NICE,
    )
