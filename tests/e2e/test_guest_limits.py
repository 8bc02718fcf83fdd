"""The agent inside a real VM when the guest runs out of something: a full filesystem."""

from __future__ import annotations

import pytest
from e2b import Sandbox
from e2b.exceptions import NotEnoughSpaceException

from .conftest import NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_upload_to_a_full_filesystem_is_507_and_the_agent_stays_up(node: NodeProcess) -> None:
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.commands.run("sudo mkdir -p /mnt/small && "
                         "sudo mount -t tmpfs -o size=1m,mode=1777 small /mnt/small")
        with pytest.raises(NotEnoughSpaceException):
            sbx.files.write("/mnt/small/big", b"x" * (2 << 20))
        # the agent keeps serving, and a write that fits still works
        sbx.files.write("/mnt/small/ok", b"fits")
        assert sbx.files.read("/mnt/small/ok") == "fits"
        assert sbx.commands.run("echo alive").stdout == "alive\n"
    finally:
        sbx.kill()
