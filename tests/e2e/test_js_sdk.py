"""The unmodified npm `e2b` SDK (pinned in tests/e2e/js/package-lock.json) against a live node.

`npm ci` runs once per lock file (node_modules/ is kept, keyed by the lock's hash); then
`node --test` runs tests/e2e/js/*.test.mjs with the SDK's env pointed at the node.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

JS_DIR = Path(__file__).parent / "js"
STAMP = JS_DIR / "node_modules" / ".aenv-lock-sha256"


def _npm_ci() -> None:
    want = hashlib.sha256((JS_DIR / "package-lock.json").read_bytes()).hexdigest()
    if STAMP.is_file() and STAMP.read_text().strip() == want:
        return
    r = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=JS_DIR, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, f"npm ci failed:\n{r.stdout}\n{r.stderr}"
    STAMP.write_text(want + "\n")


def test_npm_e2b_sdk(node: NodeProcess) -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node and npm are needed (scripts/install-host-deps.sh installs nodejs)")
    _npm_ci()
    env = {
        **os.environ,
        "E2B_API_URL": node.origin,
        "E2B_SANDBOX_URL": node.origin,
        "E2B_API_KEY": node.env["AENV_API_KEY"],
        "NO_COLOR": "1",
    }
    env.pop("E2B_DOMAIN", None)
    env.pop("E2B_DEBUG", None)
    files = sorted(p.name for p in JS_DIR.glob("*.test.mjs"))
    assert files, f"no *.test.mjs under {JS_DIR}"
    r = subprocess.run(
        ["node", "--test", "--test-reporter=tap", *files],
        cwd=JS_DIR, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = f"{r.stdout}\n{r.stderr}"
    assert r.returncode == 0, f"node --test failed:\n{out}\n{node.tail()}"
    passed = re.search(r"^# pass (\d+)$", r.stdout, re.M)
    assert passed and int(passed.group(1)) > 0 and "# fail 0" in r.stdout, out
