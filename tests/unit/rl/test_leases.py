"""Leases and reward parsing, without a node."""

from __future__ import annotations

import pytest

from aenv.orchestrator.errors import InvalidRequest, NotFound
from aenv.rl.server.evaluate import parse_reward
from aenv.rl.server.leases import Leases
from aenv.rl.server.models import Evaluate, GroupJoin, Setup, Step


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_lease_lapses_unless_renewed_and_only_its_team_sees_it() -> None:
    clock = Clock()
    leases = Leases(clock)
    a = leases.new("team-a", 10)
    clock.t += 8
    leases.renew(a.lease_id, "team-a")
    clock.t += 8
    assert leases.lapsed() == []
    with pytest.raises(NotFound):
        leases.get(a.lease_id, "team-b")
    clock.t += 3
    assert leases.lapsed() == [a]
    assert leases.lapsed() == []
    with pytest.raises(NotFound):
        leases.renew(a.lease_id, "team-a")


@pytest.mark.parametrize("bad", [0, 1.9, 24 * 3600 + 1, True])
def test_a_lease_length_out_of_bounds_is_refused(bad: float) -> None:
    with pytest.raises(InvalidRequest, match="lease_s"):
        Leases().new("t", bad)


@pytest.mark.parametrize(("raw", "reward"), [(b"1\n", 1.0), (b" 0.25 ", 0.25), (b"-3", -3.0)])
def test_a_reward_is_the_number_in_the_file(raw: bytes, reward: float) -> None:
    assert parse_reward(raw, "/r") == (reward, None)


@pytest.mark.parametrize(("raw", "why"), [(None, "wrote no"), (b"", "no number"),
                                          (b"pass", "no number"), (b"nan", "finite")])
def test_no_number_is_no_reward_never_zero(raw: bytes | None, why: str) -> None:
    reward, message = parse_reward(raw, "/r")
    assert reward is None and message is not None and why in message


def test_request_bodies_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        GroupJoin.model_validate({"key": "k", "source": {"template": "a", "image": "b"}})
    with pytest.raises(ValueError, match="not both"):
        GroupJoin.model_validate({"key": "k", "lease_s": 5, "leaseID": "x"})
    with pytest.raises(ValueError, match="sandboxID"):
        Evaluate.model_validate({"cmd": "true"})
    with pytest.raises(ValueError, match="needs snapshot"):
        Evaluate.model_validate({"cmd": "true", "base": "snapshot"})
    with pytest.raises(ValueError, match="extra"):
        GroupJoin.model_validate({"key": "k", "surprise": 1})
    steps = Setup.model_validate({"commands": ["a", {"cmd": "b", "background": True}]}).steps()
    assert steps == [Step(cmd="a"), Step(cmd="b", background=True)]
