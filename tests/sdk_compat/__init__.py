"""Runners of the E2B SDK's own test suites against a node of this checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import API_KEY, NodeProcess
from tests.support import census
from tests.support.host import free_port


def run_suite(sdk: Path, work: Path, paths: list[str], pytest_args: list[str],
              **node_env: str) -> int:
    """pytest over `paths` (under the SDK's tests/), with the SDK's own pytest.ini, against a
    node of an instance of its own (released after); its exit code."""
    instance = census.new_instance()
    node = NodeProcess(free_port(), work / "server.log", extra_env={
        "AENV_INSTANCE": instance, "AENV_PRIMED_POOL_SIZE": "0", **node_env})  # fmt: skip
    node.start()
    try:
        env = {**os.environ, "E2B_API_URL": node.origin, "E2B_SANDBOX_URL": node.origin,
               "E2B_VOLUME_API_URL": node.origin, "E2B_API_KEY": API_KEY}  # fmt: skip
        env.pop("E2B_DEBUG", None)  # debug mode skips the control plane
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs",
                "-c", str(sdk / "pytest.ini"), "--rootdir", str(sdk),
                *[str(sdk / "tests" / p) for p in paths], *pytest_args]  # fmt: skip
        return subprocess.run(argv, env=env, cwd=sdk).returncode
    finally:
        node.stop()
        census.release(instance)
        print(f"server log: {work / 'server.log'}")
