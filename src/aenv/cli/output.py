"""Where the CLI's output goes and how it looks.

Data goes to stdout, everything else (status, progress, errors) to stderr. Colours, spinners
and progress bars appear only on a terminal: rich's Console turns them off when the stream is
not a TTY, and for NO_COLOR (colour) and TERM=dumb. Listings are a table on a terminal and
JSON otherwise (or with --json), so `aenv ls | jq` just works.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any

from rich.console import Console
from rich.table import Table


@cache
def out() -> Console:
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = 400  # a forced --table into a pipe: never squeeze columns to 80
    return console


@cache
def err() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def stdout_is_tty() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def want_json(flag: bool | None) -> bool:
    """--json / --no-json win; otherwise JSON exactly when stdout is not a terminal."""
    return (not stdout_is_tty()) if flag is None else flag


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


def print_lines(lines: Sequence[str]) -> None:
    for line in lines:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for h in headers:
        table.add_column(h, no_wrap=True, overflow="ellipsis")
    for row in rows:
        table.add_row(*row)
    out().print(table)


def info(message: str) -> None:
    """A status line for a person: on stderr, and only when stderr is a terminal."""
    if err().is_terminal:
        err().print(message, markup=False)


def warn(message: str) -> None:
    err().print(f"aenv: {message}", markup=False)


@contextlib.contextmanager
def status(message: str) -> Iterator[None]:
    """A spinner on stderr while something slow happens (nothing when not on a terminal)."""
    if not err().is_terminal:
        yield
        return
    with err().status(message):
        yield


# --- time -----------------------------------------------------------------------------------


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def duration(seconds: float) -> str:
    s = int(abs(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def ago(text: str | None, now: datetime | None = None) -> str:
    t = parse_time(text)
    if t is None:
        return "-"
    now = now or datetime.now(UTC)
    return f"{duration((now - t).total_seconds())} ago"


def until(text: str | None, now: datetime | None = None) -> str:
    t = parse_time(text)
    if t is None:
        return "-"
    now = now or datetime.now(UTC)
    left = (t - now).total_seconds()
    return f"in {duration(left)}" if left > 0 else "now"


def size(n: int | float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def build_progress() -> tuple[Callable[[str], None], Callable[[], None]]:
    """A spinner with the current step on a terminal; timestamped lines otherwise."""
    t0 = time.monotonic()
    console = err()
    if not console.is_terminal:
        def say(msg: str) -> None:
            print(f"[{time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

        return say, lambda: None
    status = console.status("starting")
    status.start()

    def say_tty(msg: str) -> None:
        console.print(f"[dim]{time.monotonic() - t0:6.1f}s[/dim] {msg}", markup=True,
                      highlight=False)  # fmt: skip
        status.update(msg)

    return say_tty, status.stop
