"""Command-line options of the agent (it reads no aenv config: it runs inside the guest)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

DEFAULT_PORT = 49983
DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"
# Built into the tools drive (storage/tools.py); absent when the agent runs on a host.
DEFAULT_EXEC_HELPER = "/.aenv/bin/aenv-exec"


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """How this agent process runs. Built once from argv in ``__main__``."""

    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    # Set CLOCK_REALTIME from POST /init's timestamp (off for host tests).
    set_clock: bool = True
    # Where to create the user cgroup; None = run user processes in the agent's cgroup.
    cgroup_root: str | None = DEFAULT_CGROUP_ROOT
    # Limits of the user cgroup. memory.max defaults to guest RAM minus a reserve.
    pids_max: int = 4096
    memory_max: int | None = None
    default_user: str = "user"
    # Entropy device for POST /init's aenvEntropy (RNDADDENTROPY + RNDRESEEDCRNG).
    entropy_device: str = "/dev/random"
    log_level: str = "warning"
    # uvicorn's HTTP/1.1 parser: "httptools" (C, faster) or "h11" (pure Python).
    http: str = "auto"
    # The static helper that starts user processes (spawn.py); used if executable.
    exec_helper: str = DEFAULT_EXEC_HELPER


def parse_args(argv: list[str] | None = None) -> AgentOptions:
    """Parse ``python -m aenv.guest.agent`` arguments."""
    p = argparse.ArgumentParser(
        prog="python -m aenv.guest.agent",
        description="aenv guest agent: E2B envd-compatible API on TCP (default 49983).",
    )
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument(
        "--no-clock", action="store_true", help="never set the system clock from POST /init"
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--cgroup-root",
        default=DEFAULT_CGROUP_ROOT,
        help="cgroup2 mount under which the user-process cgroup is created",
    )
    group.add_argument(
        "--no-cgroup", action="store_true", help="do not put user processes in a cgroup"
    )
    p.add_argument("--pids-max", type=int, default=4096)
    p.add_argument("--memory-max", type=int, default=None, help="bytes (default: RAM - reserve)")
    p.add_argument("--default-user", default="user")
    p.add_argument("--entropy-device", default="/dev/random")
    p.add_argument("--log-level", default="warning")
    p.add_argument("--http", choices=["auto", "httptools", "h11"], default="auto")
    p.add_argument("--exec-helper", default=DEFAULT_EXEC_HELPER,
                   help="static helper that starts user processes (skipped if missing)")
    ns = p.parse_args(argv)
    return AgentOptions(
        host=ns.host,
        port=ns.port,
        set_clock=not ns.no_clock,
        cgroup_root=None if ns.no_cgroup else ns.cgroup_root,
        pids_max=ns.pids_max,
        memory_max=ns.memory_max,
        default_user=ns.default_user,
        entropy_device=ns.entropy_device,
        log_level=ns.log_level,
        http=ns.http,
        exec_helper=ns.exec_helper,
    )
