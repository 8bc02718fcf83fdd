"""A kernel's output messages (Jupyter's messaging protocol, iopub) as the stream's lines."""

from __future__ import annotations

import datetime as dt
from typing import Any

# MIME type -> the result line's field, in the order the SDKs' lines have them.
FIELDS = (
    ("text/plain", "text"),
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
    ("e2b/data", "data"),
    ("e2b/chart", "chart"),
)


def _unquoted(text: str) -> str:
    # A string's repr is shown without its quotes ('/home/user' -> /home/user), as E2B does.
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def result(data: dict[str, Any], main: bool) -> dict[str, Any]:
    """A display_data or execute_result bundle as a `result` line: the fields the SDKs know,
    every other MIME type in `extra`."""
    rest = dict(data)
    line: dict[str, Any] = {"type": "result"}
    for mime, field in FIELDS:
        if mime in rest:
            value = rest.pop(mime)
            line[field] = _unquoted(value) if field == "text" and isinstance(value, str) else value
    line["extra"] = rest
    line["is_main_result"] = main
    return line


def stream(name: str, text: str, when: object) -> dict[str, Any]:
    stamp = when.isoformat() if isinstance(when, dt.datetime) else str(when or "")
    return {"type": "stdout" if name == "stdout" else "stderr", "text": text, "timestamp": stamp}


def error(name: str, value: str, traceback: str | list[str]) -> dict[str, Any]:
    tb = "".join(traceback) if isinstance(traceback, list) else traceback
    return {"type": "error", "name": name, "value": value, "traceback": tb}


def count(n: int) -> dict[str, Any]:
    return {"type": "number_of_executions", "execution_count": n}


KEEPALIVE = {"type": "keepalive"}
END = {"type": "end_of_execution"}
UNEXPECTED_END = error("UnexpectedEndOfExecution", "Connection to the execution was closed "
                       "before the execution was finished", "")  # fmt: skip
