#!/usr/bin/env bash
# The E2B SDK's own template tests (sync and async) against a node of this checkout, with
# stand-in images on a local registry. Needs `aenv setup` (the `base` template) and a clone or
# mirror of github.com/e2b-dev/E2B: bash scripts/sdk-template-tests.sh GIT_DIR [REV] [-- PYTEST ARGS]
# REV defaults to the tag nearest the pinned SDK (python-sdk 2.45.1, e139fc38).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/sdk-checkout.sh
rc=0
.venv/bin/python -m tests.sdk_compat.template_suite "$sdk" --ignore-glob='*/test_stacktrace.py' \
  "$@" || rc=$?
# test_stacktrace.py never reaches a node: it monkeypatches every API call, with the signatures
# of the SDK its tag ships (under a newer SDK its mocks fail with TypeError). So it runs on its
# own, against that SDK version from PyPI, in a throwaway venv.
ver=$(sed -n 's/^version = "\(.*\)"/\1/p' "$sdk/pyproject.toml" | head -1)
echo "test_stacktrace.py (mocks only, no node) with e2b==$ver"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "e2b==$ver" pytest pytest-asyncio python-dotenv
(cd "$sdk" && E2B_API_KEY=e2b_0000000000000000000000000000000000000000 \
  "$work/venv/bin/python" -m pytest -q -p no:cacheprovider -c pytest.ini \
  tests/sync/template_sync/test_stacktrace.py tests/async/template_async/test_stacktrace.py) ||
  rc=$((rc ? rc : 1))
exit "$rc"
