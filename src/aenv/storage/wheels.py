"""Python wheels for a template's tree, installed by the host's uv.

A compiled requirements file (every package pinned, with its hashes) is installed as wheels
only into the tree's `/usr/local/lib/python3.X/dist-packages`, which Debian's Python puts on
its path: a wheel is unpacked, never built, so no package code runs on the host. Wheels are
chosen for the guest's Python and platform, not the host's.
"""

from __future__ import annotations

from pathlib import Path

from uv import find_uv_bin

from aenv.storage import children

GUEST_PYTHON = "3.11"  # Debian bookworm's
GUEST_PLATFORM = "x86_64-manylinux_2_36"  # bookworm's glibc


class WheelsError(Exception):
    pass


def site(root: Path) -> Path:
    """Where the wheels go in `root`."""
    return root / f"usr/local/lib/python{GUEST_PYTHON}/dist-packages"


def install(root: Path, requirements: Path, log_file: Path) -> Path:
    """The wheels `requirements` pins, by hash, into `root`; the directory they are in.
    Their scripts land in its `bin/` (with the host's interpreter in their first line): a
    caller links the ones it wants from `/usr/local/bin`."""
    target = site(root)
    argv = [find_uv_bin(), "pip", "install", "--quiet", "--no-deps", "--require-hashes",
            "--only-binary", ":all:", "--python-version", GUEST_PYTHON,
            "--python-platform", GUEST_PLATFORM, "--link-mode", "copy",
            # Compiled here (compiling runs no package code): under TCG a guest's Python
            # compiling IPython and its kin on first import took minutes, and again in every
            # new kernel, since a sandbox's writes are its own.
            "--compile-bytecode",
            "--target", str(target), "-r", str(requirements)]  # fmt: skip
    with log_file.open("ab") as out:
        rc = children.run(argv, out)
    if rc != 0:
        tail = log_file.read_text(errors="replace").strip().splitlines()[-3:]
        raise WheelsError(f"installing {requirements.name} failed (exit {rc}): "
                          f"{' | '.join(tail)}")  # fmt: skip
    return target
