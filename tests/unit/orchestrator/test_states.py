from __future__ import annotations

import itertools

from aenv.orchestrator.states import (
    GONE,
    PUBLIC_STATE,
    RECOVERY,
    TRANSITIONAL,
    TRANSITIONS,
    SandboxState,
    is_legal,
    states_for_public,
)

S = SandboxState

LEGAL = {
    (S.CREATING, S.RUNNING), (S.CREATING, GONE),
    (S.RUNNING, S.PAUSING), (S.RUNNING, S.SNAPSHOTTING), (S.RUNNING, S.FORKING),
    (S.RUNNING, S.ROLLING_BACK), (S.RUNNING, S.KILLING),
    (S.PAUSING, S.PAUSED), (S.PAUSING, S.RUNNING), (S.PAUSING, S.KILLING),
    (S.PAUSED, S.RESUMING), (S.PAUSED, S.KILLING),
    (S.RESUMING, S.RUNNING), (S.RESUMING, S.PAUSED), (S.RESUMING, S.KILLING),
    (S.SNAPSHOTTING, S.RUNNING), (S.SNAPSHOTTING, S.KILLING),
    (S.FORKING, S.RUNNING), (S.FORKING, S.KILLING),
    (S.ROLLING_BACK, S.RUNNING), (S.ROLLING_BACK, S.KILLING),
    (S.KILLING, GONE),
}  # fmt: skip


def test_transition_table_is_exactly_the_documented_graph() -> None:
    for src, dst in itertools.product(S, [*S, GONE]):
        assert is_legal(src, dst) == ((src, dst) in LEGAL), (src, dst)


def test_every_state_has_an_entry_everywhere() -> None:
    assert set(TRANSITIONS) == set(S)
    assert set(RECOVERY) == set(S)


def test_only_stable_states_have_no_lock_holder_and_killing_leads_only_to_gone() -> None:
    assert {S.RUNNING, S.PAUSED} == set(S) - TRANSITIONAL
    assert TRANSITIONS[S.KILLING] == {GONE}


def test_public_states_hide_creating_and_killing() -> None:
    assert S.CREATING not in PUBLIC_STATE and S.KILLING not in PUBLIC_STATE
    assert states_for_public("paused") == {S.PAUSED, S.RESUMING}
    assert S.RUNNING in states_for_public("running")
    assert set(PUBLIC_STATE.values()) == {"running", "paused"}
