"""e2b-compat.md section 12, minus pause/resume: the unmodified `e2b` SDK against a live node
(the scenarios are in scenarios.py; test_gateway.py runs them through a cluster)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from e2b import Sandbox

from tests.support.timing import scaled

from .conftest import NodeProcess
from .scenarios import async_sdk_scenario, sync_sdk_scenario

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_sync_sdk_scenario(node: NodeProcess) -> None:
    sync_sdk_scenario()


def test_metrics_are_sampled_from_the_agent(node: NodeProcess) -> None:
    sbx = Sandbox.create(timeout=60)
    try:
        start = datetime.now(UTC) - timedelta(seconds=10)
        metrics: list = []  # type: ignore[type-arg]
        deadline = time.monotonic() + scaled(30)  # a busy agent can miss the first sample
        while not metrics and time.monotonic() < deadline:
            metrics = sbx.get_metrics(start=start,
                                      end=datetime.now(UTC) + timedelta(seconds=60))
            if not metrics:
                time.sleep(1)
        assert len(metrics) >= 1
        m = metrics[0]
        assert m.cpu_count >= 1 and m.mem_total > 0 and m.disk_total > 0
        assert sbx.get_metrics(start=start - timedelta(hours=1),
                               end=start - timedelta(minutes=50)) == []  # fmt: skip
    finally:
        sbx.kill()


def test_async_sdk_scenario(node: NodeProcess) -> None:
    async_sdk_scenario()


# A stand-in for E2B's mcp-gateway: keeps its token where the SDK reads it, its config, and
# serves both on the gateway's port.
FAKE_MCP_GATEWAY = """#!/bin/sh
mkdir -p /etc/mcp-gateway
printf %s "$GATEWAY_ACCESS_TOKEN" > /etc/mcp-gateway/.token
printf %s "$2" > /etc/mcp-gateway/config.json
nohup python3 -m http.server 50005 --directory /etc/mcp-gateway >/dev/null 2>&1 &
"""


def test_mcp_starts_the_templates_gateway_and_a_template_without_one_fails_cleanly(
    node: NodeProcess,
) -> None:
    """`mcp` at create, as the SDK does it against E2B: it runs the template's mcp-gateway
    in the new sandbox, reached at port 50005; where there is none, the SDK kills the
    sandbox and raises, and nothing is left."""
    import httpx
    from e2b import SandboxQuery, SandboxState
    from e2b.exceptions import SandboxException

    config = {"echo": {"greeting": "hi"}}
    mark = {"mcp-test": str(time.time_ns())}
    with pytest.raises(SandboxException, match="Failed to start MCP gateway"):
        Sandbox.create("base", timeout=60, metadata=mark, mcp=config)  # type: ignore[arg-type]
    left = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING], metadata=mark))
    assert left.next_items() == []

    src = Sandbox.create(timeout=120)
    snap = None
    try:
        src.files.write("/usr/local/bin/mcp-gateway", FAKE_MCP_GATEWAY, user="root")
        src.commands.run("chmod 755 /usr/local/bin/mcp-gateway", user="root")
        snap = src.create_snapshot().snapshot_id
        sbx = Sandbox.create(snap, timeout=120, mcp=config)  # type: ignore[arg-type]
        try:
            token = sbx.get_mcp_token()
            assert token and len(token) == 36  # the SDK's uuid4
            assert sbx.get_mcp_url() == f"https://{sbx.get_host(50005)}/mcp"
            headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "50005"}
            deadline = time.monotonic() + scaled(60)  # python's cold start under TCG
            while True:
                r = httpx.get(f"{node.origin}/config.json", headers=headers, timeout=30)
                if r.status_code == 200 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert r.status_code == 200 and r.json() == config, r.text
        finally:
            sbx.kill()
    finally:
        src.kill()
        if snap:
            Sandbox.delete_snapshot(snap)
