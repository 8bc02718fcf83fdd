"""The one place that picks the Runtime implementation the node drives."""

from __future__ import annotations

import os

from aenv.config import Config
from aenv.machines.api import Runtime


class RuntimeUnavailable(Exception):
    pass


def make_runtime(config: Config) -> Runtime:
    if config.runtime == "fake":
        from aenv.orchestrator.fake import FakeRuntime

        # AENV_FAKE_BOOT_S: how long a fake create takes (tests of requests in flight).
        return FakeRuntime(boot_delay_s=float(os.environ.get("AENV_FAKE_BOOT_S", "0")))
    try:
        from aenv.machines.runtime import Runtime as QemuRuntime
    except ImportError as e:
        if e.name != "aenv.machines.runtime":
            raise
        raise RuntimeUnavailable(
            "the QEMU runtime (aenv.machines.runtime) is not installed in this build; "
            "set AENV_RUNTIME=fake to serve the API without VMs"
        ) from e
    from aenv.orchestrator.reclaim import reclaim_runtime

    return QemuRuntime(config, reclaimer=reclaim_runtime)
