"""The E2B SDK's own sandbox, API, volume and secret tests (sync and async) against a node
(not part of `make test`: they come from the E2B repository, which CI cannot fetch).
`scripts/sdk-tests.sh` runs this. The template tests have their own runner
(template_suite.py); the network tests need a real internet (docs/testing.md lists their
equivalents here).

Usage: python -m tests.sdk_compat.sandbox_suite SDK_DIR [--tls] [PYTEST ARGS]
(SDK_DIR: the repository's packages/python-sdk, with its pytest.ini and tests/). `--tls`: the
SDK is given E2B_DOMAIN alone, as against E2B, and reaches the node over TLS in a namespace
of its own (run_suite); without, E2B_API_URL, E2B_SANDBOX_URL and E2B_VOLUME_API_URL.
"""

from __future__ import annotations

import sys

from tests.sdk_compat import suite_main

SUITES = ("sync", "async")
# Not run: the template tests (template_suite.py), and those that need the internet or an
# E2B-hosted domain (the network tests; docs/testing.md names their equivalents here).
IGNORED = ("*/template_sync/*", "*/template_async/*", "*/test_network.py",
           "*/test_internet_access.py")  # fmt: skip


def main(argv: list[str]) -> int:
    return suite_main(argv, __doc__, list(SUITES), [f"--ignore-glob={g}" for g in IGNORED])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
