"""tests/support/strict_skips.py: with AENV_STRICT_SKIPS=1 a skip whose reason is not on the
list fails the run, an allowed one does not; without it nothing changes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import skips
from tests.support.strict_skips import ENV

pytest_plugins = ["pytester"]

ALLOWED_REASON = "KVM works on this host"
assert skips.allowed(ALLOWED_REASON) is not None

TESTS = f"""
import pytest

def test_passes():
    pass

def test_skipped_in_its_body():
    pytest.skip("make not installed")

@pytest.mark.skipif(True, reason="needs root")
def test_skipped_by_a_marker():
    pass

@pytest.fixture
def needs_a_thing():
    pytest.skip("no such thing here")

def test_skipped_in_a_fixture(needs_a_thing):
    pass

def test_skipped_for_an_allowed_reason():
    pytest.skip({ALLOWED_REASON!r})

@pytest.mark.skip(reason={ALLOWED_REASON!r})
def test_marked_for_an_allowed_reason():
    pass

@pytest.mark.xfail(reason="known", strict=True)
def test_an_xfail_is_not_a_skip():
    assert False
"""

MODULE_SKIP = """
import pytest
pytest.skip("the whole module is not for here", allow_module_level=True)

def test_never_runs():
    pass
"""


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, strict: str | None,
         *files: str) -> pytest.RunResult:  # fmt: skip
    if strict is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, strict)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(**{f"test_{i}": text for i, text in enumerate(files)})
    return pytester.runpytest("-p", "tests.support.strict_skips", "-rfEs")


@pytest.mark.parametrize("strict", [None, "0", ""])
def test_off_a_skip_stays_a_skip(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                 strict: str | None) -> None:  # fmt: skip
    r = _run(pytester, monkeypatch, strict, TESTS)
    r.assert_outcomes(passed=1, skipped=5, xfailed=1)
    assert r.ret == pytest.ExitCode.OK
    r.stdout.no_fnmatch_line("*not allowed on CI*")
    r.stdout.fnmatch_lines(["SKIPPED * make not installed"])  # -rs shows the reasons


def test_strict_a_skip_not_on_the_list_fails(pytester: pytest.Pytester,
                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    r = _run(pytester, monkeypatch, "1", TESTS)
    # In the body: a failure; by a marker or in a fixture (setup): an error.
    r.assert_outcomes(passed=1, failed=1, errors=2, skipped=2, xfailed=1)
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    r.stdout.fnmatch_lines_random([
        "*AENV_STRICT_SKIPS=1: a skip fails unless its reason is one of * allowed*",
        "skip not allowed on CI: make not installed (test_0.py:7)*",
        "skip not allowed on CI: needs root (test_0.py:9)*",
        "skip not allowed on CI: no such thing here (test_0.py:17)*",
        "FAILED *test_skipped_in_its_body - skip not allowed on CI*",  # the short summary
        "ERROR *test_skipped_by_a_marker - skip not allowed on CI*",
        "ERROR *test_skipped_in_a_fixture - skip not allowed on CI*",
        f"SKIPPED * {ALLOWED_REASON}",
    ])  # fmt: skip


def test_strict_an_allowed_skip_passes(pytester: pytest.Pytester,
                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    allowed_only = f"""
import pytest

def test_passes():
    pass

def test_skipped_for_an_allowed_reason():
    pytest.skip({ALLOWED_REASON!r})
"""
    r = _run(pytester, monkeypatch, "1", allowed_only)
    r.assert_outcomes(passed=1, skipped=1)
    assert r.ret == pytest.ExitCode.OK


def test_strict_a_module_skipped_at_collection_fails_the_run(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The other modules still run; the run fails, with the skip listed at its end."""
    r = _run(pytester, monkeypatch, "1", MODULE_SKIP, "def test_passes():\n    pass\n")
    r.assert_outcomes(passed=1, skipped=1)
    assert r.ret == pytest.ExitCode.TESTS_FAILED
    r.stdout.fnmatch_lines([
        "*skipped at collection, not allowed on CI*",
        "test_0.py: skip not allowed on CI: the whole module is not for here (*",
    ])  # fmt: skip


def test_off_a_module_skipped_at_collection_is_a_skip(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    r = _run(pytester, monkeypatch, None, MODULE_SKIP, "def test_passes():\n    pass\n")
    r.assert_outcomes(passed=1, skipped=1)
    assert r.ret == pytest.ExitCode.OK


def test_every_allowed_pattern_is_a_valid_whole_reason() -> None:
    for a in skips.ALLOWED:
        assert a.why and skips.allowed(a.pattern) in (None, a)  # compiles; matches itself or not
    # CI has the familiar base: an own-base build case that skips there fails the run.
    assert skips.allowed("e2bdev/base is not exported here (aenv setup --minimal-base)") is None
    assert skips.allowed("KVM works on this host, mostly") is None  # the whole reason


def test_the_doc_lists_every_allowed_reason() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()
    section = doc.split("## Skips", 1)[1].split("\n## ", 1)[0]
    for a in skips.ALLOWED:
        literal = re.sub(r"\\(.)", r"\1", a.pattern)  # the doc shows it unescaped
        assert f"| `{literal}` |" in section, a.pattern
    assert section.count("\n| `") == len(skips.ALLOWED)  # and nothing else
