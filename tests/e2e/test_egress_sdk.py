"""The E2B SDK's network options through a live node: the policy lands on the sandbox's
slot, stays closed by default, and what cannot be enforced is a 400. (What the rules do with
packets: tests/integration/network/test_isolation.py.)"""

from __future__ import annotations

import subprocess

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from aenv.network import netns as ns

from .conftest import NodeProcess

pytestmark = pytest.mark.e2e


def _slot_sets(instance: str) -> dict[str, str]:
    """Each slot of the instance: its `allow_special` and `allow_default` sets, as text."""
    def read() -> str:
        return "".join(subprocess.run(["nft", "list", "set", "inet", "aenv", name],
                                      capture_output=True, text=True, check=True).stdout
                       for name in ("allow_special", "allow_default"))

    return {name: ns.run_in_netns(ns.netns_path(name), read)
            for name in ns.list_netns(f"{instance}-")}


def test_sdk_network_options_reach_the_slot(node: NodeProcess) -> None:
    instance = node.env["AENV_INSTANCE"]
    sbx = Sandbox.create(network={"allow_out": ["198.51.100.7"], "deny_out": ["0.0.0.0/0"]},
                         timeout=120)
    closed = Sandbox.create(timeout=120, allow_internet_access=False)
    try:
        sets = _slot_sets(instance)
        named = [n for n, text in sets.items() if "198.51.100.7" in text]
        assert len(named) == 1
        # Public is the default (its denyOut 0/0 closes it again); `closed` has none.
        assert [n for n, text in sets.items() if "0.0.0.0/0" in text] == named
        assert sbx.commands.run("echo up").stdout == "up\n"
        assert sbx.get_info().allow_internet_access is None
    finally:
        sbx.kill()
        closed.kill()
    # Its slot is closed again once it is released.
    assert all("198.51.100.7" not in text for text in _slot_sets(instance).values())

    with pytest.raises(SandboxException, match="400: .*domains are allowed in allowOut only"):
        Sandbox.create(network={"deny_out": ["example.com"]}, timeout=60)
    with pytest.raises(SandboxException, match="400: .*IPv6"):
        Sandbox.create(network={"deny_out": ["2001:db8::/32"]}, timeout=60)
