"""Fault points: the registry matches the code, arming validates, an armed point ends the
process abruptly and an unarmed one does nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from aenv import config, faults

SRC = Path(__file__).resolve().parents[2] / "src" / "aenv"
CALL = re.compile(r"^\s+fault\((.*)\)$", re.M)  # one call per line
NAME = re.compile(r"\"([a-z_]+\.[a-z_]+)\"")


def _names_in_source() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for f in SRC.rglob("*.py"):
        if f.name == "faults.py":
            continue
        for call in CALL.findall(f.read_text()):
            for name in NAME.findall(call):
                found.setdefault(name, []).append(f.name)
    return found


def test_every_fault_call_names_a_listed_point_and_every_point_is_placed() -> None:
    found = _names_in_source()
    assert set(found) - set(faults.POINTS) == set(), "unlisted fault points in the code"
    assert set(faults.POINTS) - set(found) == set(), "listed points placed nowhere"


def test_docs_list_every_point() -> None:
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    assert [p for p in faults.POINTS if f"`{p}`" not in doc] == []


def test_parse_defaults_to_exit_and_rejects_unknown_names_and_actions() -> None:
    assert faults.parse("pause.after_save, kill.before_record=kill") == {
        "pause.after_save": "exit", "kill.before_record": "kill"}
    assert faults.parse("") == {}
    with pytest.raises(faults.FaultSpecError, match="unknown fault point"):
        faults.parse("pause.after_lunch")
    with pytest.raises(faults.FaultSpecError, match="unknown fault action"):
        faults.parse("pause.after_save=explode")


def test_config_refuses_a_bad_spec_at_load() -> None:
    assert config.load(env={"AENV_FAULTS": "snapshot.after_put"}).faults == "snapshot.after_put"
    with pytest.raises(ValueError, match="unknown fault point"):
        config.load(env={"AENV_FAULTS": "nowhere"})


def test_unarmed_points_do_nothing() -> None:
    faults.arm("")
    for name in faults.POINTS:
        faults.fault(name)
    faults.arm("pause.after_save")
    try:
        faults.fault("kill.before_record")  # armed elsewhere: still a no-op here
        assert faults.armed() == {"pause.after_save": "exit"}
    finally:
        faults.arm("")


@pytest.mark.parametrize(("action", "code"), [("exit", faults.EXIT_CODE), ("kill", -9)])
def test_an_armed_point_ends_the_process_at_once(action: str, code: int) -> None:
    prog = ("import atexit, sys; from aenv import faults\n"
            "atexit.register(lambda: print('atexit ran'))\n"
            f"faults.arm('kill.before_record={action}')\n"
            "print('before', flush=True); faults.fault('kill.before_record'); print('after')")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    assert r.returncode == code, r
    assert r.stdout == "before\n"  # nothing after the point, no atexit handler
    assert "fault point kill.before_record reached" in r.stderr
