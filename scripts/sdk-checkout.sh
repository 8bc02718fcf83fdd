# Sourced by sdk-tests.sh and sdk-template-tests.sh: parses `GIT_DIR [REV] [-- PYTEST ARGS]`
# (REV defaults to the tag nearest the pinned SDK, python-sdk 2.45.1, e139fc38) and checks
# the SDK's tests out into a temporary directory: $sdk is its packages/python-sdk, and
# $work is removed on exit. What follows `--` is left in "$@".
repo=${1:?usage: $0 GIT_DIR [REV] [-- PYTEST ARGS]}; shift
rev=e139fc38e0395907b645ab66732c2a649bc2167e
if (($#)) && [ "$1" != "--" ]; then rev=$1; shift; fi
[ "${1:-}" = "--" ] && shift
work=$(mktemp -d /tmp/aenv-sdk-tests.XXXXXX)
trap 'rm -rf "$work"' EXIT
paths=(packages/python-sdk/tests packages/python-sdk/pytest.ini packages/python-sdk/pyproject.toml)
git --git-dir="$repo" archive "$rev" "${paths[@]}" 2>/dev/null | tar -x -C "$work" ||
  git -C "$repo" archive "$rev" "${paths[@]}" | tar -x -C "$work"
sdk="$work/packages/python-sdk"
