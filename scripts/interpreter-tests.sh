#!/usr/bin/env bash
# E2B's code interpreter Python tests against a node of this checkout. Needs
# `aenv setup -t code-interpreter-v1` and a clone or mirror of github.com/e2b-dev/code-interpreter:
#   bash scripts/interpreter-tests.sh GIT_DIR [REV] [-- PYTEST ARGS]
# REV defaults to the repository's HEAD; the client is the pinned e2b-code-interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout_rev=HEAD
checkout_paths=(python/tests python/pytest.ini)
source scripts/sdk-checkout.sh
.venv/bin/python -m tests.sdk_compat.interpreter_suite "$work/python" "$@"
