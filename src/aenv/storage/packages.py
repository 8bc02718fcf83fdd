"""Debian packages for a template's tree, fetched by the host's apt.

The host's apt resolves what a tree needs against the tree's own dpkg status and downloads
the .deb files (verified against the host's signed lists); nothing of them runs here. They are
installed inside the tree by `storage.confined`.

Registry packages follow the same split in aenv's own templates: Python wheels only
(`pip --only-binary :all:`) and npm with `--ignore-scripts`, since neither runs package code
to install; anything that must run code to install is installed in a jailed build VM.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

# The familiar `base`: what E2B's base image gives beyond the minimal Debian.
FAMILIAR = ("python3-pip", "python3-venv", "python3-dev", "nodejs", "npm", "build-essential",
            "git", "curl", "wget", "unzip", "procps")  # fmt: skip
DEBS_DIR = "tmp/aenv-debs"
APT_HINT = " (the host's apt lists: `apt-get update`)"


class PackagesError(Exception):
    pass


def _apt(root: Path, *args: str) -> list[str]:
    return ["apt-get", "-q", "-y", "--no-install-recommends",
            f"-oDir::State::status={root / 'var/lib/dpkg/status'}", "-oDebug::NoLocking=1",
            *args]  # fmt: skip


def _check(argv: list[str], what: str) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        tail = p.stderr.strip().splitlines()[-3:]
        raise PackagesError(f"{what} failed: {' | '.join(tail) or f'exit {p.returncode}'}")
    return p.stdout


def download(root: Path, names: tuple[str, ...], log_file: Path) -> list[Path]:
    """The .deb files `names` need beyond what `root` holds, in `root/DEBS_DIR`; their paths
    (sorted). Fetches the host's apt lists once if they are missing or stale."""
    if not (root / "var/lib/dpkg/status").is_file():
        raise PackagesError(f"{root} holds no dpkg status: not a Debian root")
    debs = root / DEBS_DIR
    (debs / "partial").mkdir(parents=True)
    argv = _apt(root, "--download-only", f"-oDir::Cache::archives={debs}", "install", *names)
    what = f"downloading {', '.join(names)}"
    try:
        out = _check(argv, what)
    except PackagesError:  # lists never fetched or stale: fetch them once, as apt would ask
        _check(["apt-get", "update", "-qq"], "apt-get update")
        out = _check(argv, what + APT_HINT)
    with log_file.open("a") as f:
        f.write(out)
    shutil.rmtree(debs / "partial", ignore_errors=True)
    found = sorted(debs.glob("*.deb"))
    if not found:
        raise PackagesError(f"{what}: apt found nothing to install")
    return found
