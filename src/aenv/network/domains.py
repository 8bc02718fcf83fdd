"""Domain names in `allowOut`, and how the egress proxy reads one off a connection.

E2B's rules: an entry is a hostname (`example.com`) or a wildcard (`*.example.com`) that
matches every name below it at any depth, never the apex itself (list both for both). A
bare `*` is refused (it would be `0.0.0.0/0` in disguise; say that instead). Names compare
in lower case without a trailing dot. Domains are not allowed in `denyOut`.

The proxy learns the name from the first bytes a guest sends: the TLS ClientHello's SNI on
port 443, the HTTP/1 `Host` header on port 80. It never decrypts anything.
"""

from __future__ import annotations

import re
import struct

_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
MAX_NAME = 253


class DomainError(ValueError):
    """Not a domain pattern aenv can enforce."""


def normalise(name: str) -> str:
    return name.strip().lower().rstrip(".")


def is_name(name: str) -> bool:
    """A valid hostname (no wildcard), already normalised."""
    labels = name.split(".")
    return (0 < len(name) <= MAX_NAME and all(_LABEL.fullmatch(x) for x in labels)
            and not labels[-1].isdigit())  # fmt: skip  # `1.2.3.4` is an address, not a name


def parse_pattern(entry: str) -> str:
    """One `allowOut` domain entry, normalised; raises DomainError."""
    p = normalise(entry)
    if p in ("*", "*."):
        raise DomainError(f"{entry!r}: a bare wildcard is not allowed (use 0.0.0.0/0)")
    base = p[2:] if p.startswith("*.") else p
    if not is_name(base):
        raise DomainError(f"{entry!r} is not an IPv4 address, a CIDR, a hostname or "
                          "`*.` followed by a hostname")
    return p


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether the normalised `name` is allowed by one of `patterns`."""
    for p in patterns:
        if p.startswith("*."):
            if name.endswith(p[1:]) and len(name) > len(p) - 1:
                return True
        elif name == p:
            return True
    return False


# --- reading the name a connection is for --------------------------------------------------

MAX_HELLO = 16 * 1024 + 5  # one TLS record: a ClientHello larger than that is refused


class NeedMore(Exception):
    """The bytes so far end before the name."""


def tls_sni(data: bytes) -> str | None:
    """The server name of a TLS ClientHello (`data`: the first bytes of the connection).
    None: a ClientHello without SNI, or not TLS; NeedMore: read more first."""
    if len(data) < 5:
        raise NeedMore
    if data[0] != 0x16 or data[1] != 0x03:  # handshake record, TLS 1.x
        return None
    (rec_len,) = struct.unpack_from("!H", data, 3)
    if len(data) < 5 + rec_len:
        raise NeedMore
    body = memoryview(data)[5:5 + rec_len]
    try:
        if body[0] != 0x01:  # ClientHello
            return None
        i = 4 + 2 + 32  # handshake header, version, random
        i += 1 + body[i]  # session id
        (n,) = struct.unpack_from("!H", body, i)
        i += 2 + n  # cipher suites
        i += 1 + body[i]  # compression methods
        (ext_total,) = struct.unpack_from("!H", body, i)
        i += 2
        end = i + ext_total
        while i + 4 <= end:
            ext_type, ext_len = struct.unpack_from("!HH", body, i)
            i += 4
            if ext_type == 0:  # server_name: list length, then (type, length, name)...
                j = i + 2
                while j + 3 <= i + ext_len:
                    kind, n = body[j], struct.unpack_from("!H", body, j + 1)[0]
                    if kind == 0:
                        return normalise(bytes(body[j + 3:j + 3 + n]).decode("ascii"))
                    j += 3 + n
                return None
            i += ext_len
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return None


MAX_HEAD = 16 * 1024


def http_host(data: bytes) -> str | None:
    """The Host of an HTTP/1 request head (`data`: the first bytes of the connection),
    without its port. None: no Host, or not HTTP/1; NeedMore: read more first."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) >= MAX_HEAD:
            return None
        raise NeedMore
    lines = data[:end].split(b"\r\n")
    if not re.fullmatch(rb"[A-Z]+ \S+ HTTP/1\.[01]", lines[0]):
        return None
    hosts = [v.strip() for k, _, v in (ln.partition(b":") for ln in lines[1:])
             if k.strip().lower() == b"host"]  # fmt: skip
    if len(hosts) != 1:  # none, or a smuggling attempt
        return None
    try:
        host = hosts[0].decode("ascii")
    except UnicodeDecodeError:
        return None
    if host.startswith("["):  # an IPv6 literal: no name
        return None
    return normalise(host.rsplit(":", 1)[0] if ":" in host else host)
