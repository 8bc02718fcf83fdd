"""The data plane's view of the node: which sandboxes are reachable, at which address.

The orchestrator adds a route when a sandbox becomes Running and removes it before it stops
being Running (kill, TTL, pause). Removing a route aborts every open stream through it, so a
killed sandbox's streams end at once instead of hanging on a vanished VM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from aenv.machines.api import SandboxHandle


class Stream(Protocol):
    def abort(self) -> None:
        """End this proxied exchange now (the client sees the connection drop)."""


@dataclass
class Route:
    handle: SandboxHandle
    access_token: str | None
    streams: set[Stream] = field(default_factory=set)

    @property
    def sandbox_id(self) -> str:
        return self.handle.sandbox_id


class RouteTable:
    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}
        # Called after a route is removed (e.g. the proxy drops pooled connections to it).
        self.on_remove: list[Callable[[Route], None]] = []

    def add(self, handle: SandboxHandle, access_token: str | None) -> Route:
        route = Route(handle, access_token)
        self._routes[handle.sandbox_id] = route
        return route

    def get(self, sandbox_id: str) -> Route | None:
        return self._routes.get(sandbox_id)

    def remove(self, sandbox_id: str) -> Route | None:
        route = self._routes.pop(sandbox_id, None)
        if route is None:
            return None
        for s in list(route.streams):
            s.abort()
        route.streams.clear()
        for cb in self.on_remove:
            cb(route)
        return route

    def __iter__(self) -> Iterator[Route]:
        return iter(list(self._routes.values()))

    def __len__(self) -> int:
        return len(self._routes)
