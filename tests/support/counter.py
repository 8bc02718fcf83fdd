"""A guest process that counts: alive and counting on means its memory survived.

Each count is written by rename, never by `>` alone: a pause or a snapshot can stop the guest
between a `>`'s truncate and its write, and a reader would then see an empty file.
"""

from __future__ import annotations


def counting(path: str, every: float) -> str:
    """A shell loop writing 1, 2, 3... to `path`, one every `every` seconds."""
    return (f"i=0; while :; do i=$((i+1)); echo $i > {path}.new; mv {path}.new {path}; "
            f"sleep {every}; done")  # fmt: skip
