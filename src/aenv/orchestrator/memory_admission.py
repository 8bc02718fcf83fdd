"""Admission by what sandboxes hold (docs/runtime.md, "Admission by memory").

The node is full when either

    held + pending * estimate + new * estimate  >  budget
    nominal + new_nominal                        >  budget * memory_overcommit

- held: the summed PSS of the running VMMs and of hot (paused, kept) ones, measured every
  `metrics_interval_s` and after each step that relieves pressure (each snapshot's shared
  pages once, each sandbox's own pages, QEMU's own memory);
- pending: sandboxes started since that measurement; estimate: the measured mean PSS of a
  running VMM (before any measurement: a quarter of the nominal RAM), never above nominal;
- budget: `memory_budget_mib`, else the host's memory less 2 GiB;
- nominal: the running sandboxes' RAM shapes; the overcommit bounds how far measured use
  may let them go past the budget (a guest may still touch all of its RAM).

Before the held part refuses, idle sandboxes are reclaimed and hot VMMs demoted
(`memory_pressure.relieve`). A full node answers 429 with Retry-After. Team limits
(`maxMemoryMB`) stay nominal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Measured:
    held_mib: float  # running VMMs'
    sandboxes: int
    at: float
    kept_mib: float = 0.0  # hot VMMs'


@dataclass
class MemoryAdmission:
    budget_mib: int
    overcommit: float
    measured: Measured | None = None

    def record(self, pss_bytes: list[int], kept_bytes: int = 0) -> None:
        """The running VMMs' PSS each, and the hot VMMs' in all."""
        self.measured = Measured(sum(pss_bytes) / MIB, len(pss_bytes), time.monotonic(),
                                 kept_bytes / MIB)

    def estimate_mib(self, nominal_mib: int) -> float:
        m = self.measured
        if m is None or m.sandboxes == 0:
            return nominal_mib / 4
        return min(float(nominal_mib), m.held_mib / m.sandboxes)

    def held_mib(self, running: int, nominal_mib: int) -> float:
        """What the running sandboxes hold now: measured, plus an estimate for those
        started since."""
        m = self.measured
        if m is None:
            return running * self.estimate_mib(nominal_mib)
        return (m.held_mib + m.kept_mib
                + max(0, running - m.sandboxes) * self.estimate_mib(nominal_mib))

    def refusal(self, *, running: int, nominal_mib: int, vms: int, new_mib: int) -> str | None:
        """Why `vms` more sandboxes of `new_mib` MiB in all do not fit, or None."""
        bound = self.budget_mib * self.overcommit
        if nominal_mib + new_mib > bound:
            return (f"the node's sandboxes would have {nominal_mib + new_mib} MiB of RAM, over "
                    f"{bound:.0f} MiB (memory budget {self.budget_mib} MiB x overcommit "
                    f"{self.overcommit:g})")
        return self.short_of(running=running, vms=vms, new_mib=new_mib)

    def short_of(self, *, running: int, vms: int, new_mib: int) -> str | None:
        """Why what the node holds leaves no room for `vms` more sandboxes (of `new_mib` MiB
        in all), or None: the part of `refusal` that reclaim and demotion can change."""
        per = new_mib / vms if vms else 0
        held = self.held_mib(running, int(per) or 512)
        need = held + vms * self.estimate_mib(int(per) or 512)
        if vms and need > self.budget_mib:
            return (f"the node's sandboxes hold {held:.0f} MiB of memory and {vms} more would "
                    f"take it to {need:.0f} MiB, over its budget of {self.budget_mib} MiB")
        return None

    def room(self, *, running: int, nominal_mib: int, per_mib: int, want: int) -> int:
        """How many of `want` more sandboxes of `per_mib` MiB each fit (a fork's children)."""
        n = want
        while n > 0 and self.refusal(running=running, nominal_mib=nominal_mib, vms=n,
                                     new_mib=n * per_mib):
            n -= 1
        return n
