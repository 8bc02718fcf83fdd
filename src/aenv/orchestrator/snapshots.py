"""Pure logic around named snapshots: names, lookup, pagination of `GET /snapshots`, and
the references that keep a deleted snapshot's files until restores from it have cloned them.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from aenv.machines.api import SnapshotInfo, TemplateNotFound
from aenv.orchestrator.errors import InvalidRequest

if TYPE_CHECKING:
    from aenv.orchestrator.store import SandboxRecord

# E2B names look like `my-snapshot`, `team/my-snapshot` or `my-snapshot:v1`.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
MAX_PAGE = 100


class Shared(Protocol):
    """Snapshots beyond this node: its cluster's peers and snapshot store (cluster/
    sharing.py). None on a standalone node."""

    async def locate(self, name: str) -> str | None:
        """What `name` (an id or a name) names in the cluster, fetched to this node if it
        lacks it: a snapshot's id, or a template's name; None if no node and no store has
        one."""

    def used(self, snapshot_id: str) -> None:
        """A create is about to restore from `snapshot_id`, a copy fetched here (a cache
        entry: the least recently used go first)."""

    def taken(self, snap: SnapshotInfo) -> None:
        """A snapshot was just taken here (it may be published)."""

    def deleted(self, snapshot_id: str) -> None:
        """A snapshot of this node was deleted (its publication goes too)."""

    def paused(self, rec: SandboxRecord, reason: str) -> None:
        """A sandbox paused here, for `reason` ("request", "timeout", "drain", ...): its
        paused state may be published."""

    def updated(self, rec: SandboxRecord) -> None:
        """A paused sandbox's record changed (a network update): if its paused state is
        published, it is published again, so a resume elsewhere gets the change."""

    async def fork_elsewhere(self, snapshot_id: str, kids: list[SandboxRecord]
                             ) -> list[object]:  # fmt: skip
        """Start the fork children `kids` (records made here) on other nodes with room, from
        this node's `snapshot_id` (fetched from here): one answer each, a started child
        as rendered there (a dict) or why it did not start."""

    async def resuming(self, sandbox_id: str) -> None:
        """A paused sandbox is about to resume here: its published paused state, if any,
        stops being resumable elsewhere first (Unavailable if that cannot be said)."""


# Names of snapshots a plane above makes for itself (the RL plane's group start states and
# checkpoints, rl/server/): listed under that plane's routes, not in `GET /snapshots`, and
# not a name a snapshot request may give.
INTERNAL_PREFIX = "rl-"


def internal(s: SnapshotInfo) -> bool:
    return any(n.startswith(INTERNAL_PREFIX) for n in s.names)


def new_snapshot_id() -> str:
    return "snap-" + secrets.token_hex(8)


def check_name(name: str | None) -> list[str]:
    """The `names` a snapshot request gives its snapshot (none when no name)."""
    if name is None or name == "":
        return []
    if not NAME_RE.fullmatch(name):
        raise InvalidRequest(
            "invalid snapshot name: 1-128 of letters, digits and . _ : / -, "
            "starting with a letter or digit"
        )
    return [name]


def created_us(s: SnapshotInfo) -> int:
    """Creation time in Unix microseconds (0 if unreadable: such snapshots sort last)."""
    try:
        dt = datetime.fromisoformat(s.created_at.replace("Z", "+00:00"))
    except ValueError:
        return 0
    return int(dt.timestamp()) * 1_000_000 + dt.microsecond


def matches(s: SnapshotInfo, sandbox_id: str | None, name: str | None) -> bool:
    if sandbox_id is not None and s.parent != sandbox_id:
        return False
    return name is None or name == s.snapshot_id or name in s.names


def newest_named(snaps: Iterable[SnapshotInfo], name: str) -> SnapshotInfo:
    """The newest snapshot carrying `name` (a name moves to each new snapshot given it)."""
    found = [s for s in snaps if name in s.names]
    if not found:
        raise TemplateNotFound(f"template '{name}' not found")
    return max(found, key=lambda s: (created_us(s), s.snapshot_id))


def page(
    snaps: Iterable[SnapshotInfo],
    *,
    sandbox_id: str | None = None,
    name: str | None = None,
    limit: int = MAX_PAGE,
    cursor: tuple[int, str] | None = None,
) -> tuple[list[SnapshotInfo], tuple[int, str] | None]:
    """Newest first by (created, id); `cursor` is the (created, id) of the last row seen.
    Returns one page and the next page's cursor (None on the last page)."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE}")
    rows = sorted(
        ((created_us(s), s.snapshot_id, s) for s in snaps if matches(s, sandbox_id, name)),
        key=lambda r: (r[0], r[1]), reverse=True,
    )  # fmt: skip
    if cursor is not None:
        rows = [r for r in rows if (r[0], r[1]) < cursor]
    out = rows[:limit]
    nxt = (out[-1][0], out[-1][1]) if len(rows) > limit else None
    return [r[2] for r in out], nxt


class SnapshotRefs:
    """Snapshots in use by restores in flight, and those deleted meanwhile.

    `DELETE` hides a snapshot at once (listings and lookups skip it); its files go when the
    last restore using it has finished cloning them (`release` returns True then).
    """

    def __init__(self) -> None:
        self._users: dict[str, int] = {}
        self._doomed: set[str] = set()

    def acquire(self, snapshot_id: str) -> None:
        if snapshot_id in self._doomed:
            raise TemplateNotFound(f"snapshot {snapshot_id!r} not found")
        self._users[snapshot_id] = self._users.get(snapshot_id, 0) + 1

    def release(self, snapshot_id: str) -> bool:
        """Drop one use; True if the snapshot was deleted meanwhile and is now unused."""
        n = self._users.get(snapshot_id, 0) - 1
        if n > 0:
            self._users[snapshot_id] = n
            return False
        self._users.pop(snapshot_id, None)
        if snapshot_id in self._doomed:
            self._doomed.discard(snapshot_id)
            return True
        return False

    def doom(self, snapshot_id: str) -> bool:
        """Hide it; True if nothing uses it (delete the files now), else the last `release`
        says when."""
        if self._users.get(snapshot_id):
            self._doomed.add(snapshot_id)
            return False
        return True

    def hidden(self, snapshot_id: str) -> bool:
        return snapshot_id in self._doomed

    def in_use(self, snapshot_id: str) -> int:
        return self._users.get(snapshot_id, 0)
