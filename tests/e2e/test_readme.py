"""The README's first example, as a user copies it, against a real node: it prints the guest's
`uname -a` and leaves no sandbox behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import API_KEY, NodeProcess, assert_no_sandboxes

README = Path(__file__).resolve().parents[2] / "README.md"


def _example() -> str:
    """The README's `.venv/bin/python -c '...'` command, its program as written there."""
    m = re.search(r"^\.venv/bin/python -c '(.*?)'$", README.read_text(), re.M | re.S)
    assert m, "the README has no `.venv/bin/python -c '...'` example"
    return m[1]


def test_the_readme_example_runs_and_kills_its_sandbox(node: NodeProcess) -> None:
    env = {**os.environ, "E2B_API_URL": node.origin, "E2B_SANDBOX_URL": node.origin,
           "E2B_API_KEY": API_KEY}  # what the README's exports give
    r = subprocess.run([sys.executable, "-c", _example()], env=env, capture_output=True,
                       text=True, timeout=180)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("Linux "), r.stdout
    assert_no_sandboxes(node)
