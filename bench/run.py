"""Every benchmark in bench/ in turn (what `make bench` runs).

Run as root after `aenv setup`:  .venv/bin/python bench/run.py
Each script prints its own table; nothing is asserted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHES = ["runtime.py", "snapshots.py", "agent.py", "api.py", "node.py", "recovery.py",
           "memory.py", "cycles.py"]


def main() -> int:
    here = Path(__file__).parent
    failed = []
    for name in BENCHES:
        print(f"== bench/{name}", flush=True)
        if subprocess.run([sys.executable, str(here / name)]).returncode != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
