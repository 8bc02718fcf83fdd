"""Guest kernel knobs POST /init turns: the clock and the entropy pool."""

from __future__ import annotations

import fcntl
import itertools
import os
import struct
import time
from datetime import datetime

# <linux/random.h>: _IOW('R', 0x03, int[2]) and _IO('R', 0x07).
RNDADDENTROPY = 0x40085203
RNDRESEEDCRNG = 0x5207

# Ignore clock differences smaller than this (a set is a jump for every timer user).
CLOCK_TOLERANCE_S = 0.05


def parse_rfc3339(value: str) -> float:
    """Unix seconds of an RFC 3339 timestamp (``Z`` or offset; nanoseconds allowed)."""
    text = value.strip().replace("z", "Z")
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    # datetime only takes microseconds: trim longer fractions.
    if "." in text:
        head, _, rest = text.partition(".")
        digits = "".join(itertools.takewhile(str.isdigit, rest))
        tz = rest[len(digits) :]
        text = f"{head}.{digits[:6]}{tz}"
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        raise ValueError(f"timestamp without a time zone: {value!r}")
    return dt.timestamp()


def set_clock(unix_seconds: float) -> bool:
    """Set CLOCK_REALTIME if it is off by more than the tolerance. Returns True if set."""
    if abs(time.time() - unix_seconds) < CLOCK_TOLERANCE_S:
        return False
    time.clock_settime(time.CLOCK_REALTIME, unix_seconds)
    return True


def add_entropy(seed: bytes, device: str = "/dev/random") -> None:
    """Mix ``seed`` into the kernel pool, crediting it, then force a CRNG reseed.

    After a snapshot fork every child runs from the same RNG state; the node sends each one
    fresh random bytes so their /dev/urandom and getrandom() outputs diverge at once.
    Raises OSError (e.g. EPERM without CAP_SYS_ADMIN).
    """
    if not seed:
        raise ValueError("empty entropy seed")
    padded = seed + b"\0" * (-len(seed) % 4)
    info = struct.pack("ii", len(seed) * 8, len(seed)) + padded
    fd = os.open(device, os.O_WRONLY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, RNDADDENTROPY, info)
        fcntl.ioctl(fd, RNDRESEEDCRNG)
    finally:
        os.close(fd)
