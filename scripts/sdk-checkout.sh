# Sourced by sdk-tests.sh, sdk-template-tests.sh and interpreter-tests.sh: parses
# `GIT_DIR [REV] [-- PYTEST ARGS]` and checks the tests out into a temporary directory, $work,
# removed on exit. REV defaults to $checkout_rev, else the tag nearest the pinned SDK
# (python-sdk 2.45.1, e139fc38); what is checked out, to $checkout_paths, else the SDK's
# packages/python-sdk tests ($sdk). What follows `--` is left in "$@".
repo=${1:?usage: $0 GIT_DIR [REV] [-- PYTEST ARGS]}; shift
rev=${checkout_rev:-e139fc38e0395907b645ab66732c2a649bc2167e}
if (($#)) && [ "$1" != "--" ]; then rev=$1; shift; fi
[ "${1:-}" = "--" ] && shift
work=$(mktemp -d /tmp/aenv-sdk-tests.XXXXXX)
trap 'rm -rf "$work"' EXIT
paths=(packages/python-sdk/tests packages/python-sdk/pytest.ini packages/python-sdk/pyproject.toml)
[ -n "${checkout_paths+x}" ] && paths=("${checkout_paths[@]}")
git --git-dir="$repo" archive "$rev" "${paths[@]}" 2>/dev/null | tar -x -C "$work" ||
  git -C "$repo" archive "$rev" "${paths[@]}" | tar -x -C "$work"
sdk="$work/packages/python-sdk"

# Tests that never reach a node (they monkeypatch the API calls of the SDK their tag ships,
# which a newer SDK no longer makes, so under it their mocks are never hit) run on their own,
# against that SDK version from PyPI, in a throwaway venv: mock_only PYTEST_NODE_IDS...
mock_only() {
  local ver
  ver=$(sed -n 's/^version = "\(.*\)"/\1/p' "$sdk/pyproject.toml" | head -1)
  echo "$* (mocks only, no node) with e2b==$ver"
  if [ ! -x "$work/venv/bin/python" ]; then
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install -q "e2b==$ver" pytest pytest-asyncio python-dotenv
  fi
  (cd "$sdk" && E2B_API_KEY=e2b_0000000000000000000000000000000000000000 \
    "$work/venv/bin/python" -m pytest -q -p no:cacheprovider -c pytest.ini "$@")
}
