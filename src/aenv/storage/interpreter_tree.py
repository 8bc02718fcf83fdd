"""The code interpreter templates' root filesystem: the minimal Debian, the wheels a
requirements file of `aenv/interpreter/requirements/` pins, and aenv's interpreter server
(`aenv.interpreter`, copied in as source), with the script that keeps it running.

All of it is made on the host without running package code: Debian's packages as
`storage.rootfs` installs them, wheels unpacked by `storage.wheels`. The server, its kernels
and their libraries then start in a VM of the template, and the template's snapshot is taken
with them running (`images.recipes`).
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

from aenv.storage import rootfs, wheels

PORT = 49999
SERVER = Path(__file__).parents[1] / "interpreter"  # the package aenv.interpreter
REQUIREMENTS = SERVER / "requirements"
START = "/usr/local/bin/aenv-interpreter"
READY = f"curl -sf -o /dev/null http://127.0.0.1:{PORT}/health"
# What the default python context imports before the snapshot (where the wheels hold it).
PRELOAD = ("import numpy, pandas, matplotlib, matplotlib.pyplot, PIL.Image, e2b_charts")
# The start command: the server, started again whenever it ends. Its log is the template's
# start command output (a sandbox's logs).
SUPERVISE = """#!/bin/sh
# aenv's code interpreter server on port {port}, started again whenever it ends.
cd /home/user 2>/dev/null || cd /
while :; do
  python3 -m aenv.interpreter --port {port} --languages {languages} --preload '{preload}'
  echo "aenv-interpreter: the server ended (exit $?); starting it again" >&2
  sleep 1
done
"""


def sources() -> list[Path]:
    """What a tree of either kind is made from beside Debian: the server's source files, the
    requirements files and the code that installs them (their hash is the recipe's version:
    a change makes it again)."""
    makers = [Path(__file__), Path(wheels.__file__)]
    return sorted(p for p in [*SERVER.glob("*.py"), *REQUIREMENTS.glob("*.txt"), *makers])


def version() -> str:
    h = hashlib.sha256()
    for p in sources():
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


def make(root: Path, log_file: Path, log: Callable[[str], None], *, requirements: str,
         languages: str, preload: str) -> None:  # fmt: skip
    rootfs.debian(root, log_file, log)
    log(f"installing the code interpreter's wheels ({requirements}.txt)")
    site = wheels.install(root, REQUIREMENTS / f"{requirements}.txt", log_file)
    # Scripts the wheels bring name the host's Python: only Deno's binary is kept.
    scripts = site / "bin"
    if (scripts / "deno").exists():
        shutil.move(scripts / "deno", root / "usr/local/bin/deno")
    shutil.rmtree(scripts, ignore_errors=True)
    package = site / "aenv"
    (package / "interpreter").mkdir(parents=True)
    shutil.copy2(SERVER.parent / "__init__.py", package / "__init__.py")
    for p in SERVER.glob("*.py"):
        shutil.copy2(p, package / "interpreter" / p.name)
    start = root / START.lstrip("/")
    start.write_text(SUPERVISE.format(port=PORT, languages=languages, preload=preload))
    start.chmod(0o755)


def full(root: Path, log_file: Path, log: Callable[[str], None]) -> None:
    """`code-interpreter-v1`: python (numpy, pandas, matplotlib, Pillow, e2b-charts), bash,
    JavaScript and TypeScript (Deno) kernels; python and javascript contexts ready."""
    make(root, log_file, log, requirements="full", languages="python,javascript",
         preload=PRELOAD)  # fmt: skip


def minimal(root: Path, log_file: Path, log: Callable[[str], None]) -> None:
    """The python kernel alone, with no data libraries: what CI builds and checks."""
    make(root, log_file, log, requirements="python", languages="python", preload="")
