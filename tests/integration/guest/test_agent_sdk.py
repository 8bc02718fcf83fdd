"""The guest agent on the host, confined in namespaces, driven by the unmodified E2B SDK.

The SDK checks live in ``sdk/check_*.py`` and run in a pytest sub-session inside the
agent's network namespace (the client has to share it with the agent); this outer test
sets the confinement up, runs them, and checks the teardown left nothing behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.agent_ns import REPO, confined_agent, wait_gone
from tests.support.timing import scaled

SDK_CHECKS = Path(__file__).parent / "sdk"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for netns and unshare")


def run_checks(*selectors: str, timeout: float = 150) -> None:
    with confined_agent() as agent:
        env = dict(os.environ, AENVT_AGENT_URL=agent.url)
        argv = agent.exec_argv(
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-o", "python_files=check_*.py", "--timeout=60", "-rfE",
            *(selectors or (str(SDK_CHECKS),)),
        )  # fmt: skip
        # One budget for the whole nested run (about 70 checks): a busy host gets more.
        r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=scaled(timeout))  # fmt: skip
        report = r.stdout[-20000:] + r.stderr[-5000:]
        assert r.returncode == 0, f"SDK checks failed:\n{report}\n--- agent log ---\n{agent.log()}"
        summary = r.stdout.strip().splitlines()[-1]
        print(f"SDK checks inside {agent.netns}: {summary}")
        assert "skipped" not in summary, report
        assert "Traceback" not in agent.log(), agent.log()
        netns = agent.netns
    assert wait_gone(netns)


def test_sdk_checks_pass_against_the_confined_agent() -> None:
    selected = os.environ.get("AENVT_CHECKS")
    run_checks(*(selected.split() if selected else ()))
