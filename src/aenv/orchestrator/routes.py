"""The data plane's view of the node: which sandboxes are reachable, at which address.

The orchestrator adds a route when a sandbox becomes Running and removes it before it stops
being Running (kill, TTL, pause). Removing a route aborts every open stream through it, so a
killed sandbox's streams end at once instead of hanging on a vanished VM.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aenv.machines.api import SandboxHandle


class Stream(Protocol):
    def abort(self) -> None:
        """End this proxied exchange now (the client sees the connection drop)."""


MAX_HTTPS_PORTS = 100
# How long after a resume a refused connection to one of the sandbox's ports is retried.
WAKE_GRACE_S = 5.0
_MASK = re.compile(r"[A-Za-z0-9.:\-_${}\[\]]{1,255}")  # a host[:port], ${PORT} allowed


class IngressError(ValueError):
    """A network option for the sandbox's ports that is not valid."""


@dataclass(frozen=True)
class Ingress:
    """How a sandbox's own ports are reached through the proxy (E2B's network options)."""

    # allowPublicTraffic false: requests to its ports need `e2b-traffic-access-token`.
    traffic_token: str | None = None
    # maskRequestHost: the Host header the sandbox sees, `${PORT}` the port asked for.
    mask_host: str | None = None
    # httpsPorts: the proxy speaks TLS to these (the sandbox's certificate is not checked).
    https_ports: frozenset[int] = frozenset()

    @classmethod
    def from_request(cls, traffic_token: str | None, mask_host: str | None,
                     https_ports: Sequence[object] | None) -> Ingress:  # fmt: skip
        if mask_host is not None and not _MASK.fullmatch(mask_host):
            raise IngressError(f"network.maskRequestHost: {mask_host!r} is not a host name "
                               "(with an optional :port and ${PORT})")
        ports = list(https_ports or [])
        if len(ports) > MAX_HTTPS_PORTS:
            raise IngressError(f"network.httpsPorts holds more than {MAX_HTTPS_PORTS} ports")
        for p in ports:
            if isinstance(p, bool) or not isinstance(p, int) or not 0 < p < 65536:
                raise IngressError(f"network.httpsPorts: {p!r} is not a port (1-65535)")
        return cls(traffic_token, mask_host, frozenset(ports))  # type: ignore[arg-type]

    def host_header(self, port: int) -> bytes | None:
        return self.mask_host.replace("${PORT}", str(port)).encode() if self.mask_host else None

    def to_json(self) -> dict[str, Any]:
        return {"trafficToken": self.traffic_token, "maskRequestHost": self.mask_host,
                "httpsPorts": sorted(self.https_ports)}  # fmt: skip

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Ingress:
        return cls(d.get("trafficToken"), d.get("maskRequestHost"),
                   frozenset(d.get("httpsPorts") or ()))  # fmt: skip


PUBLIC = Ingress()  # the default: any client reaches any port


@dataclass
class Route:
    handle: SandboxHandle
    access_token: str | None
    ingress: Ingress = PUBLIC
    streams: set[Stream] = field(default_factory=set)
    # time.monotonic() of the resume that made this route, None for a create. Its guest's
    # processes were frozen mid-way (a server still starting when the timeout paused it),
    # so the proxy gives a port that is not yet open a grace period (`WAKE_GRACE_S`).
    woke_at: float | None = None
    # time.monotonic() of its last data-plane request's start or end, and whether its memory
    # was reclaimed since (background.idle_reclaimer).
    last_active: float = field(default_factory=time.monotonic)
    reclaimed: bool = False
    # Its VMM's CPU use, a fraction of one core, over the reclaimer's last round; and the
    # (time.monotonic(), CPU seconds) reading it came from (memory_pressure.note_cpu).
    cpu_rate: float = 0.0
    cpu_mark: tuple[float, float] | None = None

    @property
    def sandbox_id(self) -> str:
        return self.handle.sandbox_id

    @property
    def starting(self) -> bool:
        """A fork child (or a rollback) whose agent's /init is still on its way: its agent
        refuses other calls until then, which is no sign of a sandbox in trouble."""
        ready = self.handle.ready
        return ready is not None and not ready.done()


class RouteTable:
    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}
        # Called after a route is removed (e.g. the proxy drops pooled connections to it).
        self.on_remove: list[Callable[[Route], None]] = []

    def add(self, handle: SandboxHandle, access_token: str | None,
            ingress: Ingress = PUBLIC, *, resumed: bool = False) -> Route:  # fmt: skip
        route = Route(handle, access_token, ingress,
                      woke_at=time.monotonic() if resumed else None)  # fmt: skip
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
