"""The guest console on real QEMU: a flood stays inside QEMU's fixed-size ring (no host file)."""

from __future__ import annotations

import asyncio

import pytest

from aenv.machines.api import AgentInit
from aenv.vmm.qemu import CONSOLE_RING_BYTES
from tests.support import envd_client

pytestmark = [pytest.mark.vm, pytest.mark.timeout(180)]

FLOOD_BYTES = 4 * CONSOLE_RING_BYTES


def _dir_bytes(runtime, name: str) -> dict[str, int]:
    """Allocated bytes of every file in the VM's directory (a symlinked pool dir too)."""
    d = (runtime.cfg.sandboxes_dir / name).resolve()
    return {p.name: p.stat().st_blocks * 512 for p in d.iterdir() if p.is_file()}


async def test_console_flood_stays_in_the_ring_and_costs_no_host_disk(runtime, sandbox_id):
    h = await runtime.create(sandbox_id, "base", AgentInit(access_token="tok"))
    try:
        before = _dir_bytes(runtime, sandbox_id)
        assert not any(n.startswith("console") for n in before), before
        # Root writes FLOOD_BYTES of marked lines straight to the serial port.
        cmd = (f"yes aenv-console-flood | head -c {FLOOD_BYTES} | sudo tee /dev/ttyS0 "
               ">/dev/null; echo done")  # fmt: skip
        code, out, _ = await asyncio.to_thread(envd_client.run, h.url(), cmd, "tok", 120.0)
        assert (code, out) == (0, "done\n")
        tail = await runtime.machines()[sandbox_id].vm.console_tail(CONSOLE_RING_BYTES)
        assert "aenv-console-flood" in tail
        assert len(tail.encode()) <= CONSOLE_RING_BYTES
        after = _dir_bytes(runtime, sandbox_id)
        # Only the VM's own qemu.log may have grown, and not by the flood.
        assert set(after) == set(before)
        assert after.get("qemu.log", 0) < 64 * 1024, after
    finally:
        await runtime.kill(h)
