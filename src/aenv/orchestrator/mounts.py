"""Which sandboxes mount which volumes (their records say; volumes/store.py has the data)."""

from __future__ import annotations

from aenv.orchestrator.store import Store


def volume_users(store: Store, name: str) -> list[str]:
    """Ids of the sandboxes, running or paused (every record is one), that mount `name`."""
    return sorted(r.sandbox_id for r in store.all()
                  if any(n == name for n, _ in r.volume_mounts))
