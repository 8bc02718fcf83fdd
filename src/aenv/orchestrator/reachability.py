"""Whether each running sandbox's agent answers the node's probes.

The probes are the metrics sampler's (`background.metrics_sampler`, every
`metrics_interval_s`): a guest that stays RUNNING while its agent hangs pins a trainer's
worker until somebody notices, so the API reports it (`envdReachable`, docs/api.md) after
`MISSES` probes in a row went unanswered. Nothing acts on it: the sandbox is the user's, and
a kill still works. One answer clears it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

MISSES = 3  # probes in a row without an answer before a sandbox is reported unreachable


@dataclass
class _Probes:
    last_reached_us: int | None = None
    misses: int = 0


@dataclass(frozen=True)
class Reach:
    reachable: bool
    last_reached_us: int | None  # None: not reached since the node started watching it


class Reachability:
    def __init__(self, now_us: Callable[[], int]) -> None:
        self._now_us = now_us
        self._by_id: dict[str, _Probes] = {}

    def answered(self, sandbox_id: str) -> None:
        self._by_id[sandbox_id] = _Probes(self._now_us(), 0)

    def missed(self, sandbox_id: str) -> None:
        self._by_id.setdefault(sandbox_id, _Probes()).misses += 1

    def keep_only(self, running: Iterable[str]) -> None:
        """Forget sandboxes no longer running: a resumed one starts with a clean slate."""
        keep = set(running)
        for sid in [s for s in self._by_id if s not in keep]:
            del self._by_id[sid]

    def of(self, sandbox_id: str) -> Reach:
        p = self._by_id.get(sandbox_id)
        if p is None:
            return Reach(True, None)
        return Reach(p.misses < MISSES, p.last_reached_us)
