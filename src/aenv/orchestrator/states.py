"""The sandbox state machine: states, the legal transitions, and what the E2B API shows.

Every change of a sandbox's state goes through `Store.transition`, a compare-and-set in SQL
(`UPDATE ... WHERE state IN (...)`) checked against `TRANSITIONS`. An operation goes
"CAS to a transitional state -> work -> CAS to the final state"; removal (after Killing, or a
failed Creating) deletes the record, written here as the pseudo-state `GONE`.
"""

from __future__ import annotations

import enum


class SandboxState(enum.StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    SNAPSHOTTING = "snapshotting"
    FORKING = "forking"
    ROLLING_BACK = "rolling_back"  # its VM replaced by one restored from a checkpoint (rl/)
    KILLING = "killing"


S = SandboxState
GONE = "gone"  # the record is deleted

TRANSITIONS: dict[SandboxState, frozenset[SandboxState | str]] = {
    S.CREATING: frozenset({S.RUNNING, GONE}),
    S.RUNNING: frozenset({S.PAUSING, S.SNAPSHOTTING, S.FORKING, S.ROLLING_BACK, S.KILLING}),
    # A failed pause is recoverable (back to Running) unless the VMM died.
    S.PAUSING: frozenset({S.PAUSED, S.RUNNING, S.KILLING}),
    S.PAUSED: frozenset({S.RESUMING, S.KILLING}),
    # A failed resume goes back to Paused, or is removed when the paused state was lost.
    S.RESUMING: frozenset({S.RUNNING, S.PAUSED, S.KILLING}),
    S.SNAPSHOTTING: frozenset({S.RUNNING, S.KILLING}),
    S.FORKING: frozenset({S.RUNNING, S.KILLING}),
    # A failed rollback loses the sandbox (its old VM is gone): removed.
    S.ROLLING_BACK: frozenset({S.RUNNING, S.KILLING}),
    S.KILLING: frozenset({GONE}),
}

TRANSITIONAL = frozenset({S.CREATING, S.PAUSING, S.RESUMING, S.SNAPSHOTTING, S.FORKING,
                          S.ROLLING_BACK, S.KILLING})  # fmt: skip

# States that hold a live VMM (count against max_sandboxes, get TTL kills and metrics). A
# hot-paused sandbox's stopped VMM counts against the hot tier's own budget instead.
HAS_VM = frozenset({S.CREATING, S.RUNNING, S.PAUSING, S.SNAPSHOTTING, S.FORKING,
                    S.ROLLING_BACK, S.KILLING})  # fmt: skip
# States that count against max_sandboxes and the space reserve: a VMM, or one being restored.
HOLDS_CAPACITY = HAS_VM | {S.RESUMING}

# What the E2B API calls each state; states missing here are invisible (404, not listed).
PUBLIC_STATE: dict[SandboxState, str] = {
    S.RUNNING: "running",
    S.PAUSING: "running",
    S.SNAPSHOTTING: "running",
    S.FORKING: "running",
    S.ROLLING_BACK: "running",
    S.PAUSED: "paused",
    S.RESUMING: "paused",
}


def states_for_public(public: str) -> frozenset[SandboxState]:
    return frozenset(s for s, p in PUBLIC_STATE.items() if p == public)


def is_legal(src: SandboxState, dst: SandboxState | str) -> bool:
    return dst in TRANSITIONS[src]


# What a node restart does with a record it finds in each state (docs/architecture.md has
# the full table; docs/api.md repeats it).
# "adopt" = Running if the runtime re-adopts its VM (it still runs and answers: QMP, agent;
# a guest a save left stopped continues, as after a failed pause/snapshot), else removed and
# its VM, if any, killed.
# "paused" = Paused if the runtime finds complete paused state on disk (`is_paused`), else as
# "adopt". A pause writes its manifest last and a resume deletes it before the guest runs
# again, so complete paused state is always consistent; a VMM still alive beside it is killed.
# That includes a hot-paused sandbox's kept VMM (machines/hot.py): it is reclaimed, not
# re-adopted, and the sandbox resumes cold from its state on disk, which a hot pause wrote
# as completely as a cold one.
# "remove" = removed, its VM (if any) killed.
RECOVERY: dict[SandboxState, str] = {
    S.CREATING: "remove",  # the create call died with the node; the client got no id
    S.RUNNING: "adopt",
    S.PAUSING: "paused",  # Paused if the pause finished on disk, else the VM continues
    S.SNAPSHOTTING: "adopt",  # a half-written snapshot is never visible (staging + rename)
    S.FORKING: "adopt",  # children are Creating (removed); the runtime drops the fork snapshot
    # Its old VM or, once it took its /init, the one restored from the checkpoint.
    S.ROLLING_BACK: "adopt",
    S.KILLING: "remove",  # finish the kill
    S.PAUSED: "paused",  # kept while its files are on disk; a hot VMM beside them is killed
    # Paused while its state is intact; once the resume deleted it, the VM is adopted only
    # if it took its /init (the runtime's adoption record is written then), else removed.
    S.RESUMING: "paused",
}
