"""Node info on /health: the accelerator the runtime detected on this host."""

from __future__ import annotations

import os

import httpx
import pytest

from .conftest import NodeProcess

pytestmark = pytest.mark.e2e


def test_health_reports_the_detected_accelerator(node: NodeProcess) -> None:
    info = httpx.get(node.origin + "/health", timeout=5).json()
    assert info["status"] == "ok"
    # No /dev/kvm means TCG; with /dev/kvm the boot probe decides (here: a PVM, so TCG).
    expected = {"tcg"} if not os.path.exists("/dev/kvm") else {"kvm", "tcg"}
    assert info["accelerator"] in expected
