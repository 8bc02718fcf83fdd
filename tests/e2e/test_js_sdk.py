"""The unmodified npm `e2b` SDK (pinned in tests/e2e/js/package-lock.json) against a live node
(scenarios.py runs tests/e2e/js/*.test.mjs)."""

from __future__ import annotations

import pytest

from .conftest import NodeProcess
from .scenarios import js_sdk_scenario

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_npm_e2b_sdk(node: NodeProcess) -> None:
    js_sdk_scenario(node.origin, node.env["AENV_API_KEY"], node.tail)
