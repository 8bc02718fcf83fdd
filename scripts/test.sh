#!/usr/bin/env bash
# The whole test suite, phase by phase (what `make test` runs after set-up). Tests marked
# `long` are left to `make test-long` (scripts/test-long.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/suite.sh
census_baseline

phase lint     .venv/bin/ruff check src tests bench examples
phase unit     pyt unit tests/unit -m "not long"
phase vm       pyt vm tests/integration -m "not long"
phase e2e      pyt e2e tests/e2e -m "not long"
phase cli      pyt cli tests/cli -m "not long"
phase leaks    leak_check
slowest_report
phase_report "test phase"
