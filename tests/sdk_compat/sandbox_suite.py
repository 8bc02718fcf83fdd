"""The E2B SDK's own sandbox, API, volume and secret tests (sync and async) against a node
(not part of `make test`: they come from the E2B repository, which CI cannot fetch).
`scripts/sdk-tests.sh` runs this. The template tests have their own runner
(template_suite.py); the network tests need a real internet (docs/testing.md lists their
equivalents here).

Usage: python -m tests.sdk_compat.sandbox_suite SDK_DIR [PYTEST ARGS]
(SDK_DIR: the repository's packages/python-sdk, with its pytest.ini and tests/).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.e2e.conftest import API_KEY, NodeProcess
from tests.support import census
from tests.support.host import free_port

SUITES = ("sync", "async")
# Not run: the template tests (template_suite.py), and those that need the internet or an
# E2B-hosted domain (the network tests; docs/testing.md names their equivalents here).
IGNORED = ("*/template_sync/*", "*/template_async/*", "*/test_network.py",
           "*/test_internet_access.py")  # fmt: skip


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    sdk = Path(argv[0]).resolve()
    work = Path(tempfile.mkdtemp(prefix="aenv-sdk-suite-"))
    instance = census.new_instance()
    node = NodeProcess(free_port(), work / "server.log", extra_env={
        "AENV_INSTANCE": instance, "AENV_PRIMED_POOL_SIZE": "0"})  # fmt: skip
    node.start()
    try:
        env = {**os.environ, "E2B_API_URL": node.origin, "E2B_SANDBOX_URL": node.origin,
               "E2B_VOLUME_API_URL": node.origin, "E2B_API_KEY": API_KEY}  # fmt: skip
        env.pop("E2B_DEBUG", None)  # debug mode skips the control plane
        args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
                "-c", str(sdk / "pytest.ini"), "--rootdir", str(sdk),
                *(f"--ignore-glob={g}" for g in IGNORED),
                *[str(sdk / "tests" / s) for s in SUITES], *argv[1:]]  # fmt: skip
        rc = subprocess.run(args, env=env, cwd=sdk).returncode
    finally:
        node.stop()
        census.release(instance)
    print(f"server log: {work / 'server.log'}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
