"""The node's last hour, for the console's overview (`GET /overview`): every `every_s` a
sample of what each team holds (running, paused hot and cold, guest memory) and of what the
node does (creates and forks so far, memory its VMMs hold), kept in a ring buffer as the
per-sandbox metrics are. Nothing is stored: a restarted node starts a new hour."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import REGISTRY

from aenv.orchestrator.states import HOLDS_CAPACITY, PUBLIC_STATE
from aenv.orchestrator.store import Store

SAMPLE_S = 10.0
KEEP = 360  # an hour of samples


@dataclass(frozen=True)
class Holdings:
    """What one team (or the node) holds at one time."""

    running: int = 0
    hot: int = 0  # paused, its stopped VMM kept
    cold: int = 0  # paused, on disk only
    memory_mib: int = 0  # guest RAM of those holding capacity

    @property
    def paused(self) -> int:
        return self.hot + self.cold


@dataclass(frozen=True)
class Sample:
    t: float  # unix seconds
    teams: dict[str, Holdings]
    node: Holdings
    creates: float  # so far (aenv_sandbox_ops_total)
    forks: float
    held_bytes: float  # PSS of running VMMs + RSS of hot ones


@dataclass
class History:
    store: Store
    tier: Callable[[str], str | None]  # the runtime's: "hot", "cold" or None
    every_s: float = SAMPLE_S
    samples: deque[Sample] = field(default_factory=lambda: deque(maxlen=KEEP))

    def holdings(self) -> tuple[dict[str, Holdings], Holdings]:
        """Now, by team and for the node."""
        counts: dict[str, Counter[str]] = {}
        for sid, team, state, mib in self.store.briefly():
            shown = PUBLIC_STATE.get(state)
            if shown is None:  # creating or being killed: not listed, not counted
                continue
            c = counts.setdefault(team, Counter())
            if shown == "paused":
                c["hot" if self.tier(sid) == "hot" else "cold"] += 1
            else:
                c["running"] += 1
            if state in HOLDS_CAPACITY:
                c["memory_mib"] += mib
        teams = {t: Holdings(**c) for t, c in counts.items()}
        node = Counter[str]()
        for c in counts.values():
            node.update(c)
        return teams, Holdings(**node)

    def sample(self) -> Sample:
        teams, node = self.holdings()
        s = Sample(time.time(), teams, node, _ok("create"), _ok("fork"),
                   _value("aenv_sandbox_memory_bytes") + _value("aenv_hot_paused_rss_bytes"))
        self.samples.append(s)
        return s

    async def run(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a sample missed is a gap, not a stop
                self.sample()
            await asyncio.sleep(self.every_s)

    @staticmethod
    def now() -> float:
        return time.time()

    def since(self, t0: float) -> list[Sample]:
        return [s for s in self.samples if s.t >= t0]


def _value(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def _ok(op: str) -> float:
    """How many of `op` succeeded so far (a fork counts its children)."""
    return _value("aenv_sandbox_ops_total", {"op": op, "outcome": "ok"})
