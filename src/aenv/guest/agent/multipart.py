"""A streaming ``multipart/form-data`` parser with bounded memory.

``feed()`` takes body chunks as they arrive and returns events: ``PartStart(headers)``,
``bytes`` (part data, in order) and ``PART_END``. Only a delimiter-sized tail is buffered
between chunks, plus one part's headers (capped).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

MAX_HEADER_BYTES = 16 * 1024


class MultipartError(ValueError):
    """The body is not well-formed multipart."""


@dataclass(frozen=True, slots=True)
class PartStart:
    headers: dict[str, str]


class _PartEnd:
    __slots__ = ()

    def __repr__(self) -> str:
        return "PART_END"


PART_END = _PartEnd()
Event = PartStart | bytes | _PartEnd

_PARAM_RE = re.compile(r';\s*([^\s=;]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)', re.S)
# httpx/browsers (HTML5) percent-encode '"' and C0 controls except ESC inside filename="".
_HTML5_ESCAPES = re.compile(r"%(22|0[0-9A-Fa-f]|1[0-9AaC-Fc-f])")


def parse_header_params(value: str) -> tuple[str, dict[str, str]]:
    """``form-data; name="file"; filename="a/b.txt"`` → ("form-data", {...}).

    Quoted values are unescaped (quoted-pairs, then HTML5 percent escapes);
    ``filename*=UTF-8''...`` (RFC 5987) overrides ``filename``.
    """
    head, _, _rest = value.partition(";")
    params: dict[str, str] = {}
    for name, raw in _PARAM_RE.findall(value[len(head) :]):
        key = name.lower()
        val = raw.strip()
        if val.startswith('"') and val.endswith('"') and len(val) >= 2:
            val = re.sub(r"\\(.)", r"\1", val[1:-1], flags=re.S)
            val = _HTML5_ESCAPES.sub(lambda m: chr(int(m.group(1), 16)), val)
        if key.endswith("*"):
            charset, _, rest = val.partition("'")
            _lang, _, encoded = rest.partition("'")
            try:
                val = unquote(encoded, encoding=charset or "utf-8", errors="strict")
            except (LookupError, UnicodeDecodeError):
                continue
            key = key[:-1]
            params[key] = val
            params[key + "*"] = val
            continue
        if key + "*" not in params:
            params[key] = val
    return head.strip().lower(), params


def boundary_of(content_type: str) -> bytes:
    kind, params = parse_header_params(content_type)
    boundary = params.get("boundary")
    if not kind.startswith("multipart/") or not boundary:
        raise MultipartError("missing multipart boundary")
    return boundary.encode("latin-1")


class MultipartParser:
    """Incremental parser for one multipart body."""

    def __init__(self, boundary: bytes) -> None:
        self._first = b"--" + boundary
        self._delim = b"\r\n--" + boundary
        self._buf = bytearray()
        self._state = "preamble"

    @property
    def done(self) -> bool:
        return self._state == "done"

    def feed(self, data: bytes) -> list[Event]:
        self._buf += data
        events: list[Event] = []
        while True:
            if self._state == "preamble":
                # The first delimiter may open the body (no CRLF before it).
                if self._buf.startswith(self._first):
                    del self._buf[: len(self._first)]
                    self._state = "delimiter"
                    continue
                idx = self._buf.find(self._delim)
                if idx < 0:
                    keep = len(self._delim)
                    if len(self._buf) > keep:
                        del self._buf[: len(self._buf) - keep]
                    return events
                del self._buf[: idx + len(self._delim)]
                self._state = "delimiter"
            elif self._state == "delimiter":
                if len(self._buf) < 2:
                    return events
                if self._buf.startswith(b"--"):
                    self._state = "done"
                    self._buf.clear()
                    return events
                stripped = self._buf.lstrip(b" \t")
                if len(stripped) < 2:
                    return events
                if not stripped.startswith(b"\r\n"):
                    raise MultipartError("malformed multipart delimiter")
                del self._buf[: len(self._buf) - len(stripped) + 2]
                self._state = "headers"
            elif self._state == "headers":
                if self._buf.startswith(b"\r\n"):
                    end, skip = 0, 2
                else:
                    end = self._buf.find(b"\r\n\r\n")
                    skip = 4
                if end < 0:
                    if len(self._buf) > MAX_HEADER_BYTES:
                        raise MultipartError("multipart part headers too large")
                    return events
                events.append(PartStart(_parse_headers(bytes(self._buf[:end]))))
                del self._buf[: end + skip]
                self._state = "body"
            elif self._state == "body":
                idx = self._buf.find(self._delim)
                if idx < 0:
                    safe = len(self._buf) - (len(self._delim) - 1)
                    if safe > 0:
                        events.append(bytes(self._buf[:safe]))
                        del self._buf[:safe]
                    return events
                if idx:
                    events.append(bytes(self._buf[:idx]))
                events.append(PART_END)
                del self._buf[: idx + len(self._delim)]
                self._state = "delimiter"
            else:  # done: ignore the epilogue
                self._buf.clear()
                return events


def _parse_headers(raw: bytes) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").split("\r\n"):
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise MultipartError(f"malformed part header: {line!r}")
        headers[name.strip().lower()] = value.strip()
    return headers
