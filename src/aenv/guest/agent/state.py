"""Per-sandbox identity the node injects through POST /init (and may change after a fork)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from .users import UnknownUserError, User, lookup_user


@dataclass(slots=True)
class SandboxState:
    """Mutable sandbox identity: token, env vars, default user and workdir.

    Valid for the agent's lifetime; POST /init updates it in place (the event loop is the
    only writer, so readers always see a consistent value).
    """

    default_user: str = "user"
    default_workdir: str | None = None
    env_vars: dict[str, str] = field(default_factory=dict)
    access_token: str | None = None

    def token_matches(self, presented: str | None) -> bool:
        """True if no token is set, or ``presented`` is the token (constant time)."""
        if not self.access_token:
            return True
        if presented is None:
            return False
        return hmac.compare_digest(presented.encode(), self.access_token.encode())

    def user(self, name: str | None) -> User:
        """The named user, or the default one (``root`` if the default is not in the image).

        Raises UnknownUserError for an explicit name that does not exist.
        """
        if name:
            return lookup_user(name)
        try:
            return lookup_user(self.default_user)
        except UnknownUserError:
            return lookup_user("root")
