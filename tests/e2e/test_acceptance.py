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
