"""Agent round trips inside a real VM (issue 3's figures): `commands.run('true')` and a
1 MiB file write/read with the unmodified e2b SDK, straight to the agent at its slot.

Run as root after `aenv setup`:  .venv/bin/python bench/agent.py [--n 20]
The measuring code lives in tests/support/agent_vm.py (it boots its own VM); this prints
its result.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":
    repo = Path(__file__).resolve().parent.parent
    sys.exit(subprocess.run([sys.executable, "-m", "tests.support.agent_vm", "bench",
                             *sys.argv[1:]], cwd=repo).returncode)
