"""Filesystem operations shared by the RPCs and /files: parents, chown, remove."""

from __future__ import annotations

import contextlib
import os
import shutil

from .users import User


def ensure_dirs(path: str, user: User) -> None:
    """Create ``path`` and its missing parents (0755), owned by ``user``.

    Raises NotADirectoryError if a component exists and is not a directory.
    """
    missing: list[str] = []
    cur = path
    while True:
        try:
            if not os.path.isdir(cur):
                if os.path.lexists(cur):
                    raise NotADirectoryError(f"path is a file: {cur}")
                missing.append(cur)
            else:
                break
        except NotADirectoryError:
            raise
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o755)
        except FileExistsError:
            if not os.path.isdir(d):
                raise NotADirectoryError(f"path is a file: {d}") from None
            continue
        chown(d, user)


def chown(path: str | int, user: User) -> None:
    """Give ``path`` (or an open fd) to ``user``; a no-op when the agent cannot."""
    with contextlib.suppress(PermissionError):
        os.chown(path, user.uid, user.gid)


def remove_all(path: str) -> None:
    """``os.RemoveAll``: recursive, does not follow symlinks, a missing path is fine."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
