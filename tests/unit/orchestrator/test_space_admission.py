"""Space admission of a pause (space.py): it needs only the reserve, over the fake runtime
(the real disk-full case is tests/e2e/test_disk_full.py)."""

from __future__ import annotations

import pytest

from aenv.orchestrator import space
from aenv.orchestrator.errors import SpaceExhausted
from aenv.orchestrator.fake import FakeRuntime
from aenv.orchestrator.service import CreateRequest, Orchestrator
from aenv.orchestrator.states import SandboxState


async def test_a_pause_needs_the_reserve_only(orch: Orchestrator, runtime: FakeRuntime) -> None:
    reserve = orch.config.disk_reserve_mib
    a = await orch.create(CreateRequest(template="base", timeout_s=300))
    b = await orch.create(CreateRequest(template="base", timeout_s=300))
    # Inside the reserve: refused before the VM is stopped, with what was needed.
    orch.free_bytes = lambda: (reserve << 20) - 1
    with pytest.raises(SpaceExhausted, match=rf"pause a sandbox: .*\(reserve {reserve} MiB\)"):
        await orch.pause(a.sandbox_id)
    assert orch.get(a.sandbox_id).state is SandboxState.RUNNING
    assert orch.routes.get(a.sandbox_id) is not None and len(runtime.live) == 2
    # The reserve is there but not the others' RAM (1024 MiB): a pause only helps them.
    orch.free_bytes = lambda: reserve << 20
    await orch.pause(a.sandbox_id)
    assert orch.get(a.sandbox_id).state is SandboxState.PAUSED
    with pytest.raises(SpaceExhausted):  # a snapshot keeps them running: needs their RAM
        await orch.snapshot(b.sandbox_id)


def test_the_507_message_says_what_was_added_up() -> None:
    assert space.explain(512, 0, 128) == "RAM of running sandboxes 512 MiB + reserve 128 MiB"
    assert space.explain(0, 0, 128) == "reserve 128 MiB"
    assert space.explain(512, 1024, 0) == (
        "RAM of running sandboxes 512 MiB + 1024 MiB of new RAM + reserve 0 MiB")
