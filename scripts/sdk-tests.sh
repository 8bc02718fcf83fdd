#!/usr/bin/env bash
# The E2B SDK's own sandbox, API, volume and secret tests (sync and async) against a node of
# this checkout. Needs `aenv setup` and a clone or mirror of github.com/e2b-dev/E2B:
#   bash scripts/sdk-tests.sh GIT_DIR [REV] [-- PYTEST ARGS]
# REV defaults to e139fc38, python-sdk 2.45.1's release in that repository: the tests come
# from that tree, while the client they run with is the SDK pinned in pyproject.toml
# (e2b==2.63.0, newer).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/sdk-checkout.sh
# test_connect_normalizes_unset_tokens never reaches a node: it mocks the connect call of the
# SDK its tag ships (v1), which the pinned SDK no longer makes (v2).
mocked=(tests/sync/sandbox_sync/test_connect.py::test_connect_normalizes_unset_tokens
        tests/async/sandbox_async/test_connect.py::test_connect_normalizes_unset_tokens)
rc=0
.venv/bin/python -m tests.sdk_compat.sandbox_suite "$sdk" "${mocked[@]/#/--deselect=}" "$@" ||
  rc=$?
mock_only "${mocked[@]}" || rc=$((rc ? rc : 1))
exit "$rc"
