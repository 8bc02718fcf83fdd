"""The skips CI allows: every other skip fails a CI run (tests/support/strict_skips.py, on with
AENV_STRICT_SKIPS=1; docs/testing.md, "Skips", lists the same entries and why).

A skip on CI hides what it skips: a regression there would leave the run green. So the list
holds only skips whose cause is a fact of the CI host that is meant to be so, never a missing
tool, root, template or feature (scripts/install-host-deps.sh and `make artifacts` provide
those; their absence is a failure). Keep it short: a new entry needs its line in the doc.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Allowed:
    pattern: str  # matches the whole reason (re.fullmatch)
    why: str


ALLOWED: tuple[Allowed, ...] = (
    Allowed(
        r"KVM works on this host",
        "tests/integration/vmm/test_bad_input.py checks the error of a forced KVM on a host "
        "without KVM (CI's is TCG only); where KVM works there is no such error to check.",
    ),
)


def allowed(reason: str) -> Allowed | None:
    """The entry that allows a skip with this reason, or None."""
    return next((a for a in ALLOWED if re.fullmatch(a.pattern, reason.strip())), None)
