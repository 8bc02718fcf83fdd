"""What the RL plane asks of a sandbox's agent: run a command and keep its output, write
files, read one back. Straight to the agent on the sandbox's slot (as template builds do),
after its `/init`, marking the sandbox active so idle reclaim leaves it alone meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from aenv.images.agent import AgentError, BuildAgent
from aenv.orchestrator.routes import Route

_T = TypeVar("_T")

OUTPUT_CAP = 1 << 20  # bytes kept of each stream; the rest is dropped and said so
# How often a running command checks its VMM is alive: a dead VM's TCP peer never answers,
# so the stream would wait for its timeout rather than fail.
ALIVE_POLL_S = 0.5


class GuestGone(Exception):
    """The sandbox's agent could not be reached or its stream broke: the platform's fault
    (its VMM died, the node is stopping), never the command's."""


def _gone(e: Exception) -> bool:
    """A broken transport, or a stream that ended without an exit: the guest is gone. The
    agent's own refusals (a missing cwd, a path it may not write) are the caller's."""
    return isinstance(e, httpx.TransportError) or (
        isinstance(e, AgentError) and e.code == "unavailable")


@dataclass
class Output:
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def add(self, stream: str, chunk: bytes) -> None:
        buf = self.stdout if stream == "stdout" else self.stderr
        room = OUTPUT_CAP - len(buf)
        if len(chunk) > room:
            self.truncated = True
        buf += chunk[:max(0, room)]


@dataclass
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool
    duration_s: float

    def to_json(self) -> dict[str, object]:
        return {"exitCode": self.exit_code, "stdout": self.stdout, "stderr": self.stderr,
                "truncated": self.truncated, "durationMs": round(self.duration_s * 1000, 1)}


@dataclass(frozen=True)
class FileSpec:
    path: str
    data: bytes


class Guest:
    """One sandbox's agent, for as long as the caller holds it (an async context)."""

    def __init__(self, route: Route, user: str, alive: Callable[[], bool]) -> None:
        self.route = route
        self.user = user
        self.alive = alive  # its VMM still runs
        self.agent = BuildAgent(route.handle.url(), route.access_token)

    async def __aenter__(self) -> Guest:
        if (ready := self.route.handle.ready) is not None:
            try:
                await asyncio.shield(ready)
            except Exception as e:  # its /init failed: the platform's, not the caller's
                await self.agent.close()
                raise GuestGone(f"the sandbox did not start: {e}") from e
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.agent.close()

    def _touch(self) -> None:
        self.route.last_active = time.monotonic()

    async def run(self, cmd: str, *, timeout_s: float, cwd: str | None = None,
                  env: dict[str, str] | None = None, background: bool = False,
                  ) -> CommandResult:  # fmt: skip
        """`bash -l -c cmd`; TimeoutError past `timeout_s`, GuestGone if the agent fails.
        `background`: once it started (exit code -1), left running."""
        out = Output()
        t0 = time.monotonic()
        self._touch()
        try:
            async with asyncio.timeout(timeout_s):
                code = await self._watched(self.agent.run(
                    cmd, user=self.user, cwd=cwd, env=env, on_output=out.add,
                    background=background))
        except (httpx.TransportError, AgentError) as e:
            if _gone(e):
                raise GuestGone(f"the sandbox's agent failed: {e}") from e
            raise
        finally:
            self._touch()
        return CommandResult(code, out.stdout.decode(errors="replace"),
                             out.stderr.decode(errors="replace"), out.truncated,
                             time.monotonic() - t0)  # fmt: skip

    async def _watched(self, work: Awaitable[_T]) -> _T:
        """`work`, unless the VMM dies first (GuestGone)."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=ALIVE_POLL_S)
                if done:
                    return task.result()
                if not self.alive():
                    raise GuestGone("the sandbox's VMM exited")
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    async def write(self, files: list[FileSpec]) -> None:
        try:
            for f in files:
                await self.agent.write(f.path, f.data, user=self.user)
        except (httpx.TransportError, AgentError) as e:
            if _gone(e):
                raise GuestGone(f"writing files failed: {e}") from e
            raise

    async def read(self, path: str, limit: int = 4096) -> bytes | None:
        try:
            return await self.agent.read(path, user=self.user, limit=limit)
        except (httpx.TransportError, AgentError) as e:
            if _gone(e):
                raise GuestGone(f"reading {path} failed: {e}") from e
            raise
