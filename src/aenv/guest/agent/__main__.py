"""Entry point: ``python -m aenv.guest.agent [--host H] [--port P] [--no-clock]
[--cgroup-root DIR | --no-cgroup]``."""

from __future__ import annotations

from .options import parse_args
from .server import main

if __name__ == "__main__":
    main(parse_args())
