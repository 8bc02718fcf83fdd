"""On CI a skip is a failure unless its reason is on the list in tests/support/skips.py.

A pytest plugin (registered by tests/conftest.py), on when AENV_STRICT_SKIPS=1 (.ci/run sets
it): a test that skips for a reason not on the list is reported as failed (an error if it
skipped in its setup) with "skip not allowed on CI: <reason>"; a module or class skipped at
collection is listed at the end and fails the run (exit status 1) while the rest still runs.
Off, nothing changes: a developer's host may lack what CI has (root, a tool), and skips
there only say so. docs/testing.md, "Skips", has the policy and the list.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.skips import ALLOWED, allowed

ENV = "AENV_STRICT_SKIPS"


def strict() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def _skip(report: pytest.TestReport | pytest.CollectReport) -> tuple[str, str] | None:
    """(reason, where) of a skip report; None for anything else (an xfail is not a skip)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:
        path, line, msg = lr
        where = f"{os.path.relpath(path)}:{line}" if path else ""
    else:
        msg, where = str(lr), ""
    msg = "" if msg == "Skipped" else msg.removeprefix("Skipped: ")  # pytest's prefix
    return msg.strip(), where


def _message(reason: str, where: str) -> str:
    at = f" ({where})" if where else ""
    return (f"skip not allowed on CI: {reason}{at}; the allowed reasons are in "
            "tests/support/skips.py (docs/testing.md, \"Skips\")")  # fmt: skip


@dataclass
class RefusedSkip:
    """A failed report's longrepr: the message, also as the short summary's line."""

    text: str

    @property
    def reprcrash(self) -> Any:
        return SimpleNamespace(message=self.text)

    def toterminal(self, tw: Any) -> None:
        tw.line(self.text, red=True)

    def __str__(self) -> str:
        return self.text


class StrictSkips:
    """The hooks, registered only when strict: off, the plugin adds nothing to a run."""

    def __init__(self) -> None:
        self.at_collection: list[str] = []  # skipped modules or classes, not allowed

    def pytest_report_header(self) -> str:
        return f"{ENV}=1: a skip fails unless its reason is one of {len(ALLOWED)} allowed"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self) -> Any:
        report = yield
        skip = _skip(report)
        if skip is not None and allowed(skip[0]) is None:
            report.outcome = "failed"  # in setup: shown as an error
            report.longrepr = RefusedSkip(_message(*skip))
        return report

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        # Left a skip: turned into a collection error it would stop the whole run.
        skip = _skip(report)
        if skip is not None and allowed(skip[0]) is None:
            self.at_collection.append(f"{report.nodeid}: {_message(*skip)}")

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.at_collection and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.at_collection:
            terminalreporter.section("skipped at collection, not allowed on CI", red=True)
            for line in self.at_collection:
                terminalreporter.line(line, red=True)


def pytest_configure(config: pytest.Config) -> None:
    if strict():
        config.pluginmanager.register(StrictSkips(), "aenv-strict-skips")
