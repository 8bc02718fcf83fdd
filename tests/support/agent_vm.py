"""Boot one real microVM (QEMU, TCG here) with the current agent on its tools drive and
hand back its URL: for the agent benchmark and VM-only checks.

    python -m tests.support.agent_vm bench [--n 20]

Uses the node runtime (aenv.machines.runtime) cold-boot path with the default
template's rootfs, so no template snapshot is involved and the agent is the working tree's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path


@contextlib.asynccontextmanager
async def booted_agent() -> AsyncIterator[tuple[str, str, float]]:
    """(agent URL, access token, seconds from QEMU start to agent ready)."""
    from aenv import config as config_mod
    from aenv.machines.api import AGENT_PORT, AgentInit
    from aenv.machines.machine import kernel_cmdline
    from aenv.machines.runtime import Runtime
    from aenv.storage.tools import ensure_tools

    cfg = config_mod.load()
    rt = Runtime(cfg)
    await rt.start()
    try:
        tpl = rt.catalog.get(cfg.default_template)
        man = rt.snapshots.get(tpl.snapshot_id)
        tools = ensure_tools(cfg.artifacts_dir, log=lambda m: None)
        rootfs = next((cfg.templates_dir / tpl.name).glob("rootfs-*.ext4"))
        name = "agentvm" + uuid.uuid4().hex[:8]
        t0 = time.perf_counter()
        m = await rt.cold_boot(
            name, man.shape, Path(man.kernel), tools, rootfs,
            kernel_cmdline(cfg.kernel_cmdline_extra),
        )  # fmt: skip
        boot_s = time.perf_counter() - t0
        token = secrets.token_hex(16)
        try:
            await rt.push_init(m, AgentInit(access_token=token))
            yield m.slot.url(AGENT_PORT), token, boot_s
        finally:
            await rt.destroy(name)
    finally:
        await rt.close()


async def _bench(n: int) -> None:
    from tests.support.agent_bench import measure

    async with booted_agent() as (url, token, boot_s):
        result = await asyncio.to_thread(measure, url, None, n, token)
        result["cold_boot_to_agent_ready_s"] = round(boot_s, 2)  # type: ignore[assignment]
        print(json.dumps(result, indent=1))


def main() -> None:
    # A plain SIGTERM would skip the cleanup and leave the VM running: exit through it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["bench"])
    ap.add_argument("--n", type=int, default=20)
    args = ap.parse_args()
    asyncio.run(_bench(args.n))


if __name__ == "__main__":
    main()
