"""A hot pause's files made durable after it answered (docs/runtime.md, "Pause tiers").

A hot pause keeps its stopped VMM: its files (RAM, device state, disk) matter only once
that VMM is gone. Within the same boot of the host (a demotion, a node restart) the page
cache holds them whole, so the pause answers once they are written, and fsyncs them in the
background (~25-30 ms for 16 MiB written, the better part of a pause). Until then its
marker says so, with the host's boot id: a host that went down meanwhile comes back with
another boot id, and such a paused state is refused as lost rather than restored torn.
A kill and a fork of the paused state wait for the fsync first; a resume does not, it only
stops the marker from being written again once it is gone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from aenv.machines.machine import PAUSE_MARKER
from aenv.storage.files import fsync_path, write_json_atomic
from aenv.vmm import ram

log = logging.getLogger(__name__)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    return BOOT_ID.read_text().strip()


def marker(memory: bool, durable: bool) -> dict[str, object]:
    """The pause marker's content (`PAUSE_MARKER`)."""
    return {"memory": memory} if durable else {"memory": memory, "durable": False,
                                               "boot": boot_id()}  # fmt: skip


def lost(data: object) -> bool:
    """A marker of a paused state that was not yet on disk when the host went down."""
    return (isinstance(data, dict) and data.get("durable") is False
            and data.get("boot") != boot_id())  # fmt: skip


def make_durable(workdir: Path, mark: Callable[[Callable[[], None]], None] | None = None
                 ) -> None:
    """fsync what the pause wrote, then say so in its marker (blocking); `mark` runs that
    last step, or not (a resume took the paused state meanwhile)."""
    ram.durable_later(workdir / "memory")
    for name in ("disk", "state"):
        fsync_path(workdir / name)
    path = workdir / PAUSE_MARKER

    def rewrite() -> None:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("durable") is False:
            write_json_atomic(path, marker(bool(data.get("memory")), True))

    (mark or (lambda f: f()))(rewrite)


def settle_all(sandboxes_dir: Path) -> None:
    """At a node's start: the paused states an earlier process of this boot left to fsync
    (blocking)."""
    for path in sandboxes_dir.glob(f"*/{PAUSE_MARKER}"):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            if isinstance(data, dict) and data.get("durable") is False and not lost(data):
                make_durable(path.parent)


class Durability:
    """The fsyncs under way, by sandbox."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._taken: set[str] = set()  # resumed: their markers are not to be written
        self._lock = threading.Lock()  # the marker's last step against `taken`

    def start(self, name: str, workdir: Path) -> None:
        with self._lock:
            self._taken.discard(name)
        task = asyncio.get_running_loop().create_task(self._run(name, workdir))
        self._tasks[name] = task

    def taken(self, name: str) -> None:
        """The sandbox resumes: its paused state (and marker) is about to go; the fsyncs
        under way may finish, the marker is not written again."""
        with self._lock:
            if name in self._tasks:
                self._taken.add(name)

    def _mark(self, name: str, rewrite: Callable[[], None]) -> None:
        with self._lock:
            if name not in self._taken:
                rewrite()

    async def _run(self, name: str, workdir: Path) -> None:
        try:
            await asyncio.to_thread(make_durable, workdir, lambda f: self._mark(name, f))
        except (OSError, ValueError) as e:  # killed meanwhile: nothing left to keep
            log.info("the paused state of %s was not made durable: %s", name, e)
        finally:
            if self._tasks.get(name) is asyncio.current_task():
                del self._tasks[name]
                with self._lock:
                    self._taken.discard(name)

    async def wait(self, name: str) -> None:
        """Until the sandbox's paused state is on disk (if a pause left it to us)."""
        if (task := self._tasks.get(name)) is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    async def close(self) -> None:
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
