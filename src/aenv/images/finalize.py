"""A template's start command (E2B's `startCmd`): started in a VM of the template, waited for
with its ready command (`readyCmd`), then snapshotted, so sandboxes start with the process
already running. Builds run it as their last stage; `aenv pull --start-cmd` runs it for a
pulled image. VMs doing either get the egress the node config gives builds."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable
from typing import Any

from aenv.config import Config
from aenv.guest.agent.journal import START_CMD_TAG
from aenv.images.agent import BuildAgent
from aenv.images.stepcache import StepState

READY_TIMEOUT_S = 300.0
READY_INTERVAL_S = 1.0
# A snapshot keeps the guest's RAM as it is, and after a build that read or wrote much (an
# apt install) most of it is page cache: 512 of 512 MiB after the familiar base's install,
# which every sandbox of the template then maps. Above this much cache, the cache is dropped
# and free page reporting given time to hand the pages back before the final snapshot
# (layered.py does the same in its own guest process). Plain sh: images without awk.
SETTLE_ABOVE_KIB = 64 << 10
SETTLE = f"""c=0; while read -r k v _; do [ "$k" = Cached: ] && c=$v; done < /proc/meminfo
[ "$c" -gt {SETTLE_ABOVE_KIB} ] || exit 0
o=/sys/module/page_reporting/parameters/page_reporting_order; w=$(cat $o 2>/dev/null)
sync; [ -n "$w" ] && echo 4 > $o; echo 3 > /proc/sys/vm/drop_caches; sleep 10
[ -n "$w" ] && echo "$w" > $o; echo "dropped $((c / 1024)) MiB of page cache"
"""


class NotReady(Exception):
    pass


def build_egress(cfg: Config) -> Any:
    from aenv.network.egress import EgressPolicy

    allow = list(cfg.build_egress_allow)
    return EgressPolicy.from_request("0.0.0.0/0" in allow, allow, [])


async def start_and_wait(agent: BuildAgent, start_cmd: str | None, ready_cmd: str | None,
                         state: StepState, say: Callable[[str], None]) -> None:
    if start_cmd:
        say(f"Starting: {start_cmd}")
        # Tagged: the agent keeps its output for the sandboxes' logs (guest/agent/journal.py).
        await agent.run(start_cmd, user=state.user, cwd=state.workdir, env=state.env,
                        background=True, tag=START_CMD_TAG)  # fmt: skip
    if ready_cmd:
        say(f"Waiting for: {ready_cmd}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_TIMEOUT_S
        while await agent.run(ready_cmd, user=state.user, cwd=state.workdir,
                              env=state.env) != 0:  # fmt: skip
            if loop.time() > deadline:
                raise NotReady(f"the ready command did not succeed within "
                               f"{READY_TIMEOUT_S:.0f} s: {ready_cmd}")  # fmt: skip
            await asyncio.sleep(READY_INTERVAL_S)


async def settle(agent: BuildAgent, say: Callable[[str], None]) -> None:
    """Best effort: a guest that cannot (no shell, no /proc) is snapshotted as it is."""
    out: list[str] = []
    with contextlib.suppress(Exception):
        await agent.run(SETTLE, user="root", cwd="/", on_line=out.append)
    if out and out[-1].startswith("dropped"):
        say(f"{out[-1]} before the snapshot")


async def with_start_cmd(rt: Any, template: Any, start_cmd: str, ready_cmd: str | None,
                         say: Callable[[str], None], user: str | None = None) -> Any:
    """`template` (a catalog entry) snapshotted again with `start_cmd` running (as `user`,
    else the template's); the snapshot it had goes (sandboxes made from it keep their
    reflinked files)."""
    from aenv.machines.api import AgentInit

    state = StepState(dict(template.env), user or template.user or "user",
                      template.workdir or "/home/user")  # fmt: skip
    vm, token = f"start-{secrets.token_hex(4)}", secrets.token_hex(16)
    init = AgentInit(access_token=token, env_vars=dict(state.env), default_user=state.user,
                     default_workdir=state.workdir, egress=build_egress(rt.cfg))  # fmt: skip
    snap = f"tpl-{template.name}-start-{secrets.token_hex(3)}"
    try:
        handle = await rt.create(vm, template.name, init)
        agent = BuildAgent(handle.url(), token)
        try:
            await start_and_wait(agent, start_cmd, ready_cmd, state, say)
            await settle(agent, say)  # the page cache of what it read stays out of the snapshot
        finally:
            await agent.close()
        await rt.snapshot_build(vm, snap, template.name)
    finally:
        await rt.destroy(vm)
    old = template.snapshot_id
    template.snapshot_id, template.start_cmd = snap, start_cmd
    rt.catalog.put(template)
    if old != snap:
        rt.delete_snapshot(old)
    return template
