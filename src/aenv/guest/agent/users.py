"""Users and paths: who a request acts as, and envd's ``ExpandAndResolve`` for paths."""

from __future__ import annotations

import base64
import binascii
import os
import posixpath
import pwd
from dataclasses import dataclass


class UnknownUserError(LookupError):
    """The named user is not in the guest's user database."""


class InvalidPathError(ValueError):
    """A path the agent refuses to resolve (e.g. ``~other``)."""


@dataclass(frozen=True, slots=True)
class User:
    """A guest account as user processes and file ownership see it."""

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...]


_DB_FILES = ("/etc/passwd", "/etc/group")
_cache: dict[str, tuple[tuple[object, ...], User]] = {}


def _db_version() -> tuple[object, ...]:
    out: list[object] = []
    for path in _DB_FILES:
        try:
            st = os.stat(path)
        except OSError:
            out.append(None)
        else:
            out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def lookup_user(name: str) -> User:
    """Look ``name`` up in the user database.

    Every request names its user, and parsing the files costs milliseconds under TCG, so the
    answer is cached until /etc/passwd or /etc/group changes (images and commands may add
    users).
    """
    version = _db_version()
    hit = _cache.get(name)
    if hit is not None and hit[0] == version:
        return hit[1]
    user = _lookup(name)
    _cache[name] = (version, user)
    return user


def _lookup(name: str) -> User:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise UnknownUserError(f"user '{name}' not found") from None
    try:
        groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except OSError:
        groups = (pw.pw_gid,)
    return User(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir or "/", groups)


def username_from_basic_auth(header: str | None) -> str | None:
    """The user name of an ``Authorization: Basic base64(user:)`` header, else None."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=False).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    name = decoded.partition(":")[0]
    return name or None


def normalize(path: str) -> str:
    """Clean an absolute path like Go's ``filepath.Clean`` (``..`` cannot escape ``/``)."""
    cleaned = posixpath.normpath(path)
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")
    return cleaned


def expand_and_resolve(path: str, user: User, default_workdir: str | None) -> str:
    """Resolve a client path the way envd does.

    ``""`` is the default workdir (else home); a leading ``~`` is the user's home (``~other``
    is refused); a relative path is joined to home. The result is absolute and normalised.
    """
    if not path:
        path = default_workdir or user.home
    if path.startswith("~"):
        if len(path) > 1 and path[1] != "/":
            raise InvalidPathError(f"cannot expand user-specific home dir in '{path}'")
        path = user.home + "/" + path[1:]
    if not path.startswith("/"):
        path = user.home + "/" + path
    return normalize(path)
