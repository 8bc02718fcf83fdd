"""Templates that are not ready yet: one rule for every way a template comes to be.

A template being built (the build API, the node's own `base` made in the background), pulled
or fetched is *pending* under the names a create may use for it. A create naming a pending
template waits for it, up to `template_wait_s` (below the E2B SDK's 60 s request timeout),
and then answers 503 with `Retry-After` and what the work is doing, which the SDK retries.
Listings show pending templates as `building`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from aenv.orchestrator.errors import Unavailable
from aenv.storage.snapshots import now_rfc3339


class TemplateNotReady(Unavailable):
    """503: the template is on its way; `retry_after_s` says when to ask again."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(eq=False)  # identity: one piece of work
class Pending:
    """Work that will make a template: `status()` says where it is, `done` when it ends
    (made or failed: a create then looks the name up again)."""

    names: tuple[str, ...]
    what: str  # "build", "pull", "fetch"
    status: Callable[[], str]
    started: float = field(default_factory=time.monotonic)
    since: str = field(default_factory=now_rfc3339)  # when it began, for listings
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def describe(self) -> str:
        return (f"template '{self.names[0]}' is not ready yet ({self.what} running for "
                f"{time.monotonic() - self.started:.0f} s: {self.status()})")  # fmt: skip


class PendingTemplates:
    def __init__(self, wait_s: float, retry_after_s: int = 10) -> None:
        self.wait_s = wait_s
        self.retry_after_s = retry_after_s
        self._by_name: dict[str, Pending] = {}

    def add(self, names: list[str], what: str, status: Callable[[], str]) -> Pending:
        p = Pending(tuple(dict.fromkeys(names)), what, status)
        for n in p.names:
            self._by_name[n] = p
        return p

    def end(self, p: Pending) -> None:
        for n in p.names:
            if self._by_name.get(n) is p:
                del self._by_name[n]
        p.done.set()

    @contextlib.contextmanager
    def making(self, names: list[str], what: str,
               status: Callable[[], str]) -> Iterator[Pending]:  # fmt: skip
        """`names` are pending while the block (the work that makes them) runs."""
        p = self.add(names, what, status)
        try:
            yield p
        finally:
            self.end(p)

    def track(self, names: list[str], what: str, status: Callable[[], str],
              task: asyncio.Future[object]) -> None:  # fmt: skip
        """`names` are pending until `task` ends."""
        p = self.add(names, what, status)
        task.add_done_callback(lambda _: self.end(p))

    def find(self, candidates: list[str]) -> Pending | None:
        """The work making the first of `candidates` (the names a create may mean)."""
        for n in candidates:
            if (p := self._by_name.get(n)) is not None:
                return p
        return None

    def all(self) -> list[Pending]:
        return list(dict.fromkeys(self._by_name.values()))

    async def wait(self, p: Pending) -> None:
        """Until `p` ends; TemplateNotReady (503) past the bound."""
        try:
            await asyncio.wait_for(p.done.wait(), self.wait_s)
        except TimeoutError:
            raise TemplateNotReady(p.describe(), retry_after_s=self.retry_after_s) from None
