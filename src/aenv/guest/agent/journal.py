"""What the guest has to say for its sandbox's log (docs/api.md, "Logs"): the output of the
template's start command, a line an entry, and the agent's own warnings.

Bounded: the newest MAX_ENTRIES entries, lines cut at MAX_LINE bytes. Entries are numbered;
the node reads those after the last number it has (`GET /aenv/logs?after=N`). The journal
lives in guest memory, so a sandbox restored from its template's snapshot starts with what
the start command printed while the template was built, as E2B's logs show it.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass

START_CMD_TAG = "aenv-start-cmd"  # the tag the template builder starts its startCmd with
MAX_ENTRIES = 2000
MAX_LINE = 4096
MAX_PAGE = 500


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    ts_us: int
    level: str  # debug, info, warn, error
    message: str
    fields: dict[str, str]

    def to_json(self) -> dict[str, object]:
        return {"seq": self.seq, "tsUs": self.ts_us, "level": self.level,
                "message": self.message, "fields": self.fields}  # fmt: skip


class Journal:
    def __init__(self) -> None:
        self._entries: collections.deque[Entry] = collections.deque(maxlen=MAX_ENTRIES)
        self._seq = 0
        self._partial: dict[tuple[int, str], bytes] = {}

    def add(self, level: str, message: str, **fields: str) -> None:
        self._seq += 1
        self._entries.append(Entry(self._seq, time.time_ns() // 1000, level,
                                   message[:MAX_LINE], fields))  # fmt: skip

    def output(self, pid: int, stream: str, data: bytes) -> None:
        """A chunk of a start command's output: its complete lines become entries."""
        buf = self._partial.pop((pid, stream), b"") + data
        *lines, rest = buf.split(b"\n")
        if len(rest) > MAX_LINE:  # no newline for a long while: cut it here
            lines.append(rest)
            rest = b""
        for line in lines:
            self._line(pid, stream, line)
        if rest:
            self._partial[(pid, stream)] = rest

    def ended(self, pid: int, status: str) -> None:
        for stream in ("stdout", "stderr", "pty"):
            rest = self._partial.pop((pid, stream), b"")
            if rest:
                self._line(pid, stream, rest)
        self.add("info", f"start command ended: {status}", source="startCmd", pid=str(pid))

    def _line(self, pid: int, stream: str, line: bytes) -> None:
        self.add("error" if stream == "stderr" else "info",
                 line.rstrip(b"\r").decode(errors="replace"),
                 source="startCmd", stream=stream, pid=str(pid))  # fmt: skip

    def since(self, after: int, limit: int = MAX_PAGE) -> tuple[list[Entry], int]:
        """Entries numbered above `after` (at most `limit`), and the number to ask after next.
        A number past the last means the journal began again (a reboot): from the start."""
        if after > self._seq:
            after = 0
        out = [e for e in self._entries if e.seq > after][:limit]
        return out, out[-1].seq if out else after


class JournalHandler(logging.Handler):
    """The agent's own warnings and errors, into the journal."""

    def __init__(self, journal: Journal) -> None:
        super().__init__(logging.WARNING)
        self.journal = journal

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = "error" if record.levelno >= logging.ERROR else "warn"
            self.journal.add(level, record.getMessage(), source="agent")
        except Exception:  # a log call never fails the agent
            self.handleError(record)
