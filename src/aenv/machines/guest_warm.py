"""Warming a primed VM's translation cache under TCG.

A restored QEMU under TCG translates every guest instruction it runs for the first time:
the agent's process-start path and the shell it starts cost ~0.25 s more on a sandbox's
first command, its first terminal answers in ~0.4 s instead of ~0.2 s
(`bench/primed.py`). A primed VM is kept stopped, and a stopped QEMU
keeps what it translated, so priming runs what a new sandbox's first commands run: the
shell, once on a terminal (`pty.create`) and once on pipes (`commands.run`).

Only a shell that reads no startup file runs (`--noprofile --norc`, no history): the
template's (or a user snapshot's) own files run nothing before the sandbox's first
command, and nothing is written. Best effort: a template without bash is primed without it.
Under KVM nothing is translated, and nothing is run.
"""

from __future__ import annotations

import logging

import httpx

from aenv.machines.api import GuestUnresponsive
from aenv.machines.guest_flush import run_process

log = logging.getLogger(__name__)

SHELL = ("/bin/bash", "--noprofile", "--norc")
WARM_ENVS = {"HISTFILE": ""}
WARM_TIMEOUT_S = 30.0  # each; a primed VM is made in the background
WARM_RUNS: tuple[tuple[tuple[str, ...], bool], ...] = (
    ((*SHELL, "-i", "-c", "exit"), True),  # an interactive shell on a terminal
    ((*SHELL, "-c", "true"), False),  # a command on pipes
)


async def warm(http: httpx.AsyncClient, base_url: str, token: str | None) -> bool:
    """Run WARM_RUNS in the guest (its agent's access token: `token`); False (logged) if
    one did not exit cleanly."""
    for argv, pty in WARM_RUNS:
        try:
            end = await run_process(http, base_url, token, argv, WARM_TIMEOUT_S,
                                    envs=WARM_ENVS, pty=pty)  # fmt: skip
        except GuestUnresponsive as e:
            log.info("warming a primed VM: %s", e)
            return False
        if end is None or not end.get("exited") or end.get("exitCode", 0) != 0:
            log.info("warming a primed VM: %s ended %s", " ".join(argv), end)
            return False
    return True
