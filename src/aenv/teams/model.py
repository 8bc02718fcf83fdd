"""What a team and a key are, and the checks on what a caller may name them."""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

DEFAULT_TEAM = "default"  # owns what was made before teams, and the node's own key
NODE_KEY_ID = "node"  # the node's own key (api_key): changed by its file, never revoked
KEY_PREFIX = "aenv_"
MAX_NAME = 64
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")


class TeamError(ValueError):
    status = 400


class TeamNotFound(TeamError):
    status = 404


class TeamExists(TeamError):
    status = 409


@dataclass(frozen=True)
class Team:
    team_id: str
    name: str
    max_sandboxes: int | None  # None: only the node's own limit
    max_memory_mib: int | None
    created_us: int
    # The registries this team's creates and builds may pull images from, in place of the
    # node's `image_registries` (None: the node's; an admin, the operator, sets it).
    image_registries: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ApiKey:
    """A key as stored: never the key itself, only its hash and a mask to recognise it."""

    key_id: str
    team_id: str
    name: str
    mask: str  # the prefix and the last four characters
    admin: bool
    created_us: int
    revoked_us: int | None


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: the team of its key, and whether that key is an admin's."""

    team_id: str
    key_id: str
    admin: bool


def new_key() -> str:
    return KEY_PREFIX + secrets.token_hex(20)


def key_hash(key: str) -> str:
    # Keys are 160 random bits: a plain digest cannot be reversed, and a lookup by it is exact.
    return hashlib.sha256(key.encode()).hexdigest()


def mask(key: str) -> str:
    return f"{key[:len(KEY_PREFIX) + 2]}…{key[-4:]}"


def check_name(name: object, what: str = "team") -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME:
        raise TeamError(f"a {what} name is 1 to {MAX_NAME} characters of a-z, 0-9, '-' and "
                        f"'_', starting with a letter or digit; got {name!r}")
    return name


MAX_REGISTRIES = 64


def check_registries(value: object) -> tuple[str, ...] | None:
    """A team's `imageRegistries`: entries as `image_registries` has them, or None."""
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) > MAX_REGISTRIES or any(
            not isinstance(e, str) or not e or len(e) > 255 or "://" in e
            or any(c.isspace() for c in e) for e in value):  # fmt: skip
        raise TeamError(f"imageRegistries is a list of up to {MAX_REGISTRIES} registries "
                        "(`host`, `host:port`, `host/path` or \"*\"), or null for the "
                        "node's own list")  # fmt: skip
    return tuple(dict.fromkeys(value))


def check_limit(value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TeamError(f"{what} must be a whole number from 0 up, or null for no limit")
    return value
