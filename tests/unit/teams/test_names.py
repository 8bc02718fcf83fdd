"""Template names per team: scoped, shown, and resolved own-first."""

from __future__ import annotations

from aenv.teams.model import DEFAULT_TEAM
from aenv.teams.names import candidates, scoped, shown, visible


def test_a_teams_names_are_its_own_and_public_ones_are_everyones() -> None:
    assert scoped("base", DEFAULT_TEAM) == "base"
    assert scoped("py:v1", "t1") == "py~t1:v1" and shown("py~t1:v1") == "py:v1"
    assert shown("py~t1") == "py" and shown("base:v2") == "base:v2"
    assert visible("base", "t1") and visible("py~t1", "t1") and not visible("py~t1", "t2")
    assert not visible("py~t1:v1", "t2") and visible("py~t1:v1", "t1")
    assert candidates("py", "t1") == ["py~t1", "py"]
    assert candidates("py", DEFAULT_TEAM) == ["py"]
    assert candidates("py~t2", "t1") == [] and candidates("py~t1", "t1") == ["py~t1"]
