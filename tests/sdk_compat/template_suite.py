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

import sys
import tempfile
from pathlib import Path

from tests.sdk_compat import run_suite
from tests.support.image_state import removed_after
from tests.support.registry import seeded_registry

SUITES = ("sync/template_sync", "async/template_async")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    sdk = Path(argv[0]).resolve()
    work = Path(tempfile.mkdtemp(prefix="aenv-sdk-suite-"))
    with removed_after(), seeded_registry(work) as seeded:
        return run_suite(sdk, work, list(SUITES), argv[1:],
                         AENV_REGISTRY_MIRRORS=f"docker.io=http://{seeded.registry.host}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
