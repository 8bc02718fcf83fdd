"""A sandbox's logs hold what its template's start command prints (E2B's sandbox logs), read
with the SDK's generated client and E2B's own CLI (`@e2b/cli`) from a real VM: the lines
printed while the template was built and those printed since the sandbox started."""

from __future__ import annotations

import os
import time

from e2b import Sandbox, Template, wait_for_timeout
from e2b.api.client.api.sandboxes import (
    get_sandboxes_sandbox_id_logs,
    get_v_2_sandboxes_sandbox_id_logs,
)
from e2b.api.client.client import AuthenticatedClient
from e2b.api.client.models import LogLevel

from tests.support.image_state import removed_after
from tests.support.timing import scaled

from .conftest import API_KEY, NodeProcess
from .scenarios import e2b_cli

START = ("echo ready-$((6*7)); echo warned >&2; "
         "while true; do echo tick-$(date +%s); sleep 1; done")  # fmt: skip


def test_the_start_commands_output_is_in_the_sandboxs_logs(node: NodeProcess) -> None:
    name = f"logs-{os.urandom(3).hex()}"
    client = AuthenticatedClient(base_url=node.origin, token=API_KEY, prefix="",
                                 auth_header_name="X-API-Key")  # fmt: skip
    with removed_after():
        Template.build(Template().from_template("base").set_start_cmd(
            START, wait_for_timeout(1000)), name)  # fmt: skip
        sbx = Sandbox.create(name, timeout=120)
        try:
            started = time.time()
            deadline = time.monotonic() + scaled(30)
            while True:
                got = get_v_2_sandboxes_sandbox_id_logs.sync(
                    sbx.sandbox_id, client=client, search="startCmd")
                lines = [e.message for e in got.logs]
                ticks = [int(m.split("-")[1]) for m in lines if m.startswith("tick-")]
                if any(t >= int(started) for t in ticks):
                    break  # printed in this sandbox, after its restore
                assert time.monotonic() < deadline, f"no tick since the start: {lines}"
                time.sleep(0.5)
            assert lines[:2] == ["ready-42", "warned"]  # from the build, before the snapshot
            warned = next(e for e in got.logs if e.message == "warned")
            assert warned.level == LogLevel.ERROR and warned.fields["stream"] == "stderr"
            errors = get_v_2_sandboxes_sandbox_id_logs.sync(
                sbx.sandbox_id, client=client, level=LogLevel.ERROR, search="startCmd")
            assert [e.message for e in errors.logs] == ["warned"]
            v1 = get_sandboxes_sandbox_id_logs.sync(sbx.sandbox_id, client=client)
            assert any("ready-42" in line.line for line in v1.logs)
            # E2B's own CLI reads them too (v1, its `start` cursor).
            out = e2b_cli(node.origin, API_KEY, "sandbox", "logs", sbx.sandbox_id,
                          "--format", "json")  # fmt: skip
            assert "ready-42" in out and "tick-" in out, out
            again = get_v_2_sandboxes_sandbox_id_logs.sync(
                sbx.sandbox_id, client=client, search="ready-42")
            assert len(again.logs) == 1  # taken from the guest once
            # A sandbox whose logs nobody read while it ran: the kill takes them first.
            quiet = Sandbox.create(name, timeout=120)
            quiet.commands.run("sleep 1")
            quiet.kill()
            ended = get_v_2_sandboxes_sandbox_id_logs.sync(
                quiet.sandbox_id, client=client, search="startCmd")
            lines = [e.message for e in ended.logs]
            assert lines[:2] == ["ready-42", "warned"] and any(
                m.startswith("tick-") for m in lines[2:]), lines
        finally:
            sbx.kill()
            with node.api() as c:
                c.delete(f"/templates/{name}")
