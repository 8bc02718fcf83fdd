"""The CLI's one error type, and the entry point that turns every failure into one line.

A command raises `CliError("what went wrong")`; `AenvTyper.__call__` prints it as
`aenv: what went wrong` on stderr and exits non-zero. Usage errors, Ctrl-C and unexpected
exceptions end the same way (set AENV_DEBUG=1 for a traceback of the unexpected ones). A bad
setting (`aenv.config.ConfigError`, or a `CliError` with EXIT_CONFIG) is one line naming it,
and exit 2.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

import click
import typer

from aenv.config_errors import ConfigError

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CONFIG = 2  # a bad setting: nothing was started
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure to report as one line: `aenv: <message>`, exit `code`."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def say_error(message: str) -> None:
    with contextlib.suppress(OSError):
        print(f"aenv: {one_line(message)}", file=sys.stderr, flush=True)


def each(items: list[str], act: Callable[[str], None]) -> None:
    """Run `act` for every item; report each failure on a line of its own and exit 1 if any
    failed (with one item, its failure is the command's own error)."""
    failed = False
    for item in items:
        try:
            act(item)
        except CliError as e:
            if len(items) == 1:
                raise
            say_error(e.message)
            failed = True
    if failed:
        raise typer.Exit(EXIT_ERROR)


def _exit(code: int) -> NoReturn:
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    sys.exit(code)


def _guard(f: Callable[..., Any]) -> Callable[..., Any]:
    """Ctrl-C in a command is a one-line error too (typer would exit 130 silently)."""

    @functools.wraps(f)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except KeyboardInterrupt:
            raise CliError("interrupted", EXIT_INTERRUPTED) from None

    return run


def restore_ctrl_c() -> None:
    """Make SIGINT raise KeyboardInterrupt, whatever disposition we inherited.

    A non-interactive shell starts its `&` jobs with SIGINT ignored, and CPython then leaves it
    ignored: an `aenv upload` run from such a script (or a test suite run as one) would ignore
    Ctrl-C and an explicit `kill -INT` and copy on for minutes. Every command here handles
    KeyboardInterrupt as one line and exit 130, so it must always be raised.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


class AenvTyper(typer.Typer):
    """typer.Typer whose errors are one plain line on stderr instead of a rich panel."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
        register = super().command(*args, **kwargs)

        def decorator(f: Callable[..., Any]) -> Callable[..., Any]:
            register(_guard(f))
            return f

        return decorator

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        restore_ctrl_c()
        cmd = typer.main.get_command(self)
        kwargs.setdefault("prog_name", "aenv")
        try:
            rv = cmd.main(*args, standalone_mode=False, **kwargs)
        except CliError as e:
            say_error(e.message)
            _exit(e.code)
        except ConfigError as e:
            say_error(str(e))
            _exit(EXIT_CONFIG)
        except click.UsageError as e:
            hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            say_error(e.format_message().rstrip(".") + hint)
            _exit(EXIT_USAGE)
        except click.ClickException as e:
            say_error(e.format_message())
            _exit(e.exit_code)
        except click.Abort:
            say_error("aborted")
            _exit(EXIT_INTERRUPTED)
        except KeyboardInterrupt:
            say_error("interrupted")
            _exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            # `aenv ls | head`: the reader went away; nothing to report.
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
            _exit(EXIT_ERROR)
        except OSError as e:
            if e.errno == errno.EPIPE:
                _exit(EXIT_ERROR)
            say_error(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""))
            _exit(EXIT_ERROR)
        except Exception as e:
            if os.environ.get("AENV_DEBUG"):
                traceback.print_exc()
            say_error(f"internal error: {type(e).__name__}: {e} (AENV_DEBUG=1 shows a traceback)")
            _exit(EXIT_ERROR)
        if isinstance(rv, int) and not isinstance(rv, bool):
            _exit(rv)
        _exit(0)
