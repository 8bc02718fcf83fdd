#!/usr/bin/env bash
# `.ci/run` with a bounded CPU hog beside it (stress-ng on every core), to shake out tests
# whose timing only holds on a quiet machine. Usage: bash scripts/ci-loaded.sh [MINUTES]
# Run it from a fresh clone, and never beside another suite (they share the host slot lock).
set -uo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-90}
command -v stress-ng >/dev/null || bash scripts/install-host-deps.sh
stress-ng --cpu "$(nproc)" --timeout "${minutes}m" --quiet &
hog=$!
trap 'kill "$hog" 2>/dev/null; wait "$hog" 2>/dev/null' EXIT
echo "ci-loaded: stress-ng --cpu $(nproc) (pid $hog) for at most $minutes min"
bash .ci/run
