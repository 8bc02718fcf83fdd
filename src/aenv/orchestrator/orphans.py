"""Creates nobody received: a sandbox whose create's client left before the answer is
removed, unless the create carried an `Idempotency-Key` (docs/api.md, "Orphans").

A trainer that times out or cancels a create never learns the sandbox's id, so nothing would
ever kill it: on hosted platforms that race left sandboxes by the ten thousand. With a key,
the client means to retry: a retry with the same key (and body) gets the same sandbox, and
the sandbox is removed only if no retry has taken it within `KEYED_GRACE_S`.

Behind a cluster gateway the keys live in etcd and the gateway watches its own client
(cluster/gateway/orphans.py); a gateway's create carries the id it placed, and the node keeps
no key of its own for it. The node's client is then the gateway: if that connection drops
(the gateway died mid-create), the sandbox is removed as here, after the grace if the
create carried a key (its retry, through another gateway, takes it).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aenv.obs import log_event
from aenv.orchestrator.errors import InvalidRequest, NotFound, OrchestratorError, StateConflict
from aenv.orchestrator.requests import new_sandbox_id
from aenv.tasks import TaskSet

log = logging.getLogger("aenv.orchestrator")

KEYED_GRACE_S = 60.0  # a keyed create nobody received waits this long for its retry
RETAIN_S = 24 * 3600  # a key names its sandbox this long (E2B's 24 h)
MAX_KEY_LEN = 256


class KeyReused(StateConflict):
    """409: an Idempotency-Key sent again with a different request."""


@dataclass
class Claim:
    sandbox_id: str
    body_sha256: str
    at: float = field(default_factory=time.monotonic)
    done: bool = False  # its create succeeded: a retry gets that sandbox, never a new one
    received: bool = False  # an answer naming its sandbox reached a client still there
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # its first try ended


class CreateKeys:
    """The node's `Idempotency-Key`s: (team, key) -> the sandbox its create makes. In
    memory: a node restart forgets them (its sandboxes stay; a retry then makes another)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], Claim] = {}

    async def claim(self, team_id: str, key: str, body: bytes) -> tuple[Claim, bool]:
        """The claim this try works under, and whether it is the first try (which creates);
        a later try waits until the first one has ended. KeyReused (409) for another body."""
        if not key or len(key) > MAX_KEY_LEN:
            raise InvalidRequest(f"Idempotency-Key must be 1-{MAX_KEY_LEN} characters")
        self._prune()
        digest = hashlib.sha256(body).hexdigest()
        while True:
            c = self._by_key.get((team_id, key))
            if c is None:
                c = self._by_key[(team_id, key)] = Claim(new_sandbox_id(), digest)
                return c, True
            if c.body_sha256 != digest:
                raise KeyReused("this Idempotency-Key was used for a different request")
            if c.done or c.settled.is_set():
                return c, False
            await c.settled.wait()  # then look again: a failed first try let the key go

    def ended(self, team_id: str, key: str, c: Claim, ok: bool) -> None:
        """The first try's create ended; a failed one lets the key go (an error is not
        replayed: the retry is a new attempt)."""
        c.done = c.done or ok
        if not c.done and self._by_key.get((team_id, key)) is c:
            del self._by_key[(team_id, key)]
        c.settled.set()

    def _prune(self) -> None:
        old = time.monotonic() - RETAIN_S
        for k in [k for k, c in self._by_key.items() if c.at < old]:
            del self._by_key[k]


class Orphans:
    """Removes the sandboxes of creates nobody received. `kill` is the orchestrator's."""

    def __init__(self, kill: Callable[[str], Awaitable[None]],
                 keyed_grace_s: float = KEYED_GRACE_S) -> None:  # fmt: skip
        self._kill = kill
        self.keyed_grace_s = keyed_grace_s
        self._tasks = TaskSet()
        self._keyed: dict[str, Claim] = {}  # keyed orphans waiting for a retry to take them

    def left(self, sandbox_id: str, claim: Claim | None) -> None:
        """The create of `sandbox_id` answered a client that had gone."""
        if claim is not None:
            self._keyed[sandbox_id] = claim
        self._tasks.spawn(self._remove(sandbox_id, claim), f"aenv-orphan-{sandbox_id}")

    async def _remove(self, sandbox_id: str, claim: Claim | None) -> None:
        if claim is not None:
            await asyncio.sleep(self.keyed_grace_s)
            self._keyed.pop(sandbox_id, None)
            if claim.received:
                return
        try:
            await self._kill(sandbox_id)
        except (NotFound, StateConflict):
            return  # killed meanwhile, or ended on its own
        except OrchestratorError as e:
            log_event(log, "sandbox.orphan_remove_failed", logging.WARNING,
                      sandbox_id=sandbox_id, error=str(e))  # fmt: skip
            return
        log_event(log, "sandbox.orphan_removed", sandbox_id=sandbox_id,
                  keyed=claim is not None)  # fmt: skip

    def taken(self, sandbox_id: str) -> None:
        """A create's answer naming `sandbox_id` reached a client still there (a retry's)."""
        if (c := self._keyed.get(sandbox_id)) is not None:
            c.received = True

    async def close(self) -> None:
        await self._tasks.close()
