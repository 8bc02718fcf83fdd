"""Deadlines that scale with how loaded this machine is right now.

A bound tuned on a quiet machine fails on a busy one (a CI host, a CPU hog beside the suite):
`scaled(s)` stretches `s` by the current run-queue pressure, the 1-minute load average per
core (never below 1, at most MAX_FACTOR). Use it for deadlines that only guard against a
hang; a test that measures speed belongs in bench/.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_FACTOR = 6.0


def load_factor() -> float:
    try:
        load1 = float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 1.0
    return max(1.0, min(MAX_FACTOR, load1 / (os.cpu_count() or 1)))


def scaled(seconds: float) -> float:
    return seconds * load_factor()
