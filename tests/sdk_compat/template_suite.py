"""The E2B SDK's own template tests against a node (not part of `make test`: they come from
the E2B repository, which CI cannot fetch). `scripts/sdk-template-tests.sh` runs this.

A registry on loopback serves stand-ins (busybox images) under the Docker Hub names the tests
use (`ubuntu:22.04`, `e2bdev/base`), through the node's `docker.io` mirror; a node of its own
instance serves the API; pytest runs the SDK's `tests/sync/template_sync` and
`tests/async/template_async` with E2B_API_URL pointed at the node. Templates the run builds
are removed afterwards. Usage: python -m tests.sdk_compat.template_suite SDK_DIR [PYTEST ARGS]
(SDK_DIR: the repository's packages/python-sdk, with its pytest.ini and tests/).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.e2e.conftest import NodeProcess
from tests.support import census
from tests.support.host import free_port
from tests.support.image_state import removed_after
from tests.support.registry import seeded_registry

SUITES = ("sync/template_sync", "async/template_async")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    sdk = Path(argv[0]).resolve()
    tests = sdk / "tests"
    work = Path(tempfile.mkdtemp(prefix="aenv-sdk-suite-"))
    instance = census.new_instance()
    with removed_after(), seeded_registry(work) as seeded:
        node = NodeProcess(free_port(), work / "server.log", extra_env={
            "AENV_INSTANCE": instance, "AENV_PRIMED_POOL_SIZE": "0",
            "AENV_REGISTRY_MIRRORS": f"docker.io=http://{seeded.registry.host}"})  # fmt: skip
        node.start()
        try:
            env = {**os.environ, "E2B_API_URL": node.origin, "E2B_SANDBOX_URL": node.origin,
                   "E2B_API_KEY": "aenv-e2e-key"}  # fmt: skip
            argv_ = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs",
                     "-c", str(sdk / "pytest.ini"), "--rootdir", str(sdk),
                     *[str(tests / s) for s in SUITES], *argv[1:]]  # fmt: skip
            rc = subprocess.run(argv_, env=env, cwd=sdk).returncode
        finally:
            node.stop()
            census.release(instance)
    print(f"server log: {work / 'server.log'}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
