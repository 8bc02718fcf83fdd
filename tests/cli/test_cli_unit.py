"""The CLI's pure parts: id prefixes, argument parsing, ssh escapes, exit statuses, wiring."""

from __future__ import annotations

import inspect

import pytest
import typer

from aenv.cli.client import resolve_prefix
from aenv.cli.errors import CliError
from aenv.cli.sandboxes import parse_mib, parse_pairs, parse_seconds
from aenv.cli.terminal import EscapeFilter, exit_status

IDS = ["abc123", "abd456", "xyz789"]


def test_resolve_prefix() -> None:
    assert resolve_prefix("abc123", IDS, "sandbox") == "abc123"
    assert resolve_prefix("abc", IDS, "sandbox") == "abc123"
    assert resolve_prefix("x", IDS, "sandbox") == "xyz789"
    with pytest.raises(CliError, match=r"ambiguous sandbox id prefix 'ab' \(2 matches: "
                       r"abc123, abd456\)"):  # fmt: skip
        resolve_prefix("ab", IDS, "sandbox")
    with pytest.raises(CliError, match="no such sandbox: q"):
        resolve_prefix("q", IDS, "sandbox")
    with pytest.raises(CliError, match="empty"):
        resolve_prefix("", IDS, "sandbox")
    # An exact id wins even if it prefixes another.
    assert resolve_prefix("ab", ["ab", "abc"], "snapshot") == "ab"


def test_parse_arguments() -> None:
    assert [parse_seconds(t) for t in ("300", "90s", "5m", "2h", "1d")] == [
        300, 90, 300, 7200, 86400]  # fmt: skip
    assert [parse_mib(t) for t in ("512", "512M", "2G", "1gib")] == [512, 512, 2048, 1024]
    assert parse_pairs(["A=1", "B=x=y", "C="], "--env") == {"A": "1", "B": "x=y", "C": ""}
    for bad in (lambda: parse_seconds("soon"), lambda: parse_mib("2T"),
                lambda: parse_pairs(["novalue"], "--env")):  # fmt: skip
        with pytest.raises(typer.BadParameter):
            bad()


def test_escapes_like_ssh() -> None:
    f = EscapeFilter()
    assert f.feed(b"ls ~/x\r") == (b"ls ~/x\r", None)  # not at a line start
    assert f.feed(b"~") == (b"", None)  # held
    assert f.feed(b"/tmp") == (b"~/tmp", None)  # not an escape: sent as typed
    assert f.feed(b"\r~~") == (b"\r~", None)
    assert f.feed(b"\r~?") == (b"\r", "help")
    assert f.feed(b"\r~.rest") == (b"\r", "detach")
    assert EscapeFilter().feed(b"~.") == (b"", "detach")  # the very start counts as a line


def test_exit_status() -> None:
    assert exit_status({"exited": True, "status": "exit status 0"}) == 0
    assert exit_status({"exitCode": 3, "exited": True}) == 3
    assert exit_status({"exitCode": -1, "status": "signal: killed"}) == 137
    assert exit_status({"exitCode": -1, "status": "signal: terminated"}) == 143
    assert exit_status({"exitCode": -1, "status": "signal: something else"}) == 255


def test_setup_wrapper_matches_setup() -> None:
    """main.setup defers aenv.cli.setup's imports; it passes every option on."""
    from aenv.cli import main
    from aenv.cli.setup import setup

    assert list(inspect.signature(main.setup).parameters) == list(
        inspect.signature(setup).parameters)
