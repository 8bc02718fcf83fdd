"""Long build steps on the host (debootstrap, apt, mkfs), run so that they can be stopped.

A node makes its default template in the background (`images.bases`); a node that stops
meanwhile must not leave a debootstrap running into a directory nobody will remove. Work that
may be stopped sets a `Children` as the current one (a context variable, which
`asyncio.to_thread` carries into its thread); each step then runs in a process group of its
own, known to it until it ends, and `Children.stop` kills every group: the thread waiting on
it returns, and its staging directory is removed. Without a current `Children` a step simply
runs (`aenv setup`, where Ctrl-C reaches the whole process group).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO


class Stopped(Exception):
    """The step was killed by `Children.stop`."""


class Children:
    def __init__(self) -> None:
        self._live: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._stopped = False

    def start(self, argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._stopped:
                raise Stopped(f"{argv[0]}: stopped")
            p = subprocess.Popen(argv, start_new_session=True, **kw)  # type: ignore[call-overload]
            self._live.add(p)
            return p

    def wait(self, p: subprocess.Popen[bytes]) -> int:
        try:
            rc = p.wait()
        finally:
            with self._lock:
                self._live.discard(p)
        if self._stopped:
            raise Stopped(f"{p.args[0]}: stopped")  # type: ignore[index]
        return rc

    def stop(self) -> None:
        """Kills every step running now and refuses new ones."""
        with self._lock:
            self._stopped = True
            for p in self._live:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)


_current: contextvars.ContextVar[Children | None] = contextvars.ContextVar(
    "aenv_build_children", default=None)


@contextlib.contextmanager
def stoppable(children: Children) -> Iterator[None]:
    """Steps run in this context (and threads started from it) belong to `children`."""
    token = _current.set(children)
    try:
        yield
    finally:
        _current.reset(token)


def run(argv: list[str], out: IO[bytes] | int, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> int:  # fmt: skip
    """`argv`'s exit status (stderr with stdout into `out`); Stopped if it was stopped."""
    kw = {"stdout": out, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL,
          "env": env, "cwd": cwd}  # fmt: skip
    group = _current.get()
    if group is None:
        return subprocess.run(argv, **kw).returncode  # type: ignore[call-overload, no-any-return]
    return group.wait(group.start(argv, **kw))
