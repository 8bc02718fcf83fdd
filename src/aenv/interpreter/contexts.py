"""Contexts: each one Jupyter kernel of a language, started by `jupyter_client` in its own
working directory, with a client on its channels and a lock that runs one execution at a
time. A context's id is its own (a uuid); a language's default context is made on its first
use (python's and the configured defaults' at start) and again if it was removed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import NoSuchKernel
from jupyter_client.manager import AsyncKernelManager

from aenv.interpreter import formatters, kernelspecs
from aenv.interpreter.languages import DEFAULT_CWD, kernel_spec, normalize

log = logging.getLogger("aenv.interpreter")

STATE_DIR = Path("~/.local/share/aenv-interpreter")  # the kernel specs it writes
START_TIMEOUT_S = 60.0  # a kernel's first kernel_info reply (a fresh JVM is the slowest)


class ContextError(Exception):
    """A context that could not be made or changed (500, its message as the body)."""


class ContextNotFound(ContextError):
    def __init__(self, context_id: object) -> None:
        super().__init__(f"Context {context_id} not found")


@dataclass(eq=False)
class Context:
    id: str
    language: str
    cwd: str
    km: AsyncKernelManager
    kc: Any  # its AsyncKernelClient, channels started
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one run at a time
    # One restart at a time: a client's, or the server's of a kernel that died.
    restarting: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Set when the kernel is restarted or removed: a run in flight ends at once.
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    # The sandbox's env vars, set in this kernel at its first run (None: not yet).
    globals_: dict[str, str] | None = None
    # What the last run left to finish before the next starts (an interrupt, an env restore).
    settling: asyncio.Task[None] | None = None
    removed: bool = False

    def info(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    async def settle(self) -> None:
        if self.settling is not None:
            with contextlib.suppress(Exception):
                await self.settling
            self.settling = None


async def _start(language: str, cwd: str, env: dict[str, str]) -> Context:
    km = AsyncKernelManager(kernel_name=kernel_spec(language))
    try:
        await km.start_kernel(cwd=cwd, env=env)
    except NoSuchKernel:
        raise ContextError(f"Failed to create context: no kernel for language {language!r} in "
                           "this template") from None  # fmt: skip
    except (OSError, RuntimeError) as e:
        raise ContextError(f"Failed to create context: {e}") from None
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=START_TIMEOUT_S)
    except RuntimeError as e:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
        raise ContextError(f"Failed to create context: {e}") from None
    return Context(str(uuid.uuid4()), language, cwd, km, kc)


class Contexts:
    def __init__(self, cwd: str = DEFAULT_CWD, ipython_dir: Path | None = None,
                 state_dir: Path | None = None) -> None:  # fmt: skip
        self.cwd = cwd  # a context's directory unless its create names one
        # The kernels' specs (kernelspecs.py), and their environment: the server's, with the
        # IPython profile that loads the formatters (formatters.py) in the python kernels.
        self.kernels = kernelspecs.install(state_dir or STATE_DIR.expanduser())
        ipython_dir = ipython_dir or Path(os.environ.get("IPYTHONDIR") or "~/.ipython").expanduser()
        formatters.write_startup(ipython_dir)
        self._env = {**os.environ, "IPYTHONDIR": str(ipython_dir)}
        self._all: dict[str, Context] = {}  # in the order they were made
        self._default: dict[str, str] = {}  # language -> its default context's id
        self._making: dict[str, asyncio.Lock] = {}

    async def create(self, language: str | None, cwd: str | None) -> Context:
        ctx = await _start(normalize(language), cwd or self.cwd, self._env)
        self._all[ctx.id] = ctx
        log.info("context %s: %s in %s", ctx.id, ctx.language, ctx.cwd)
        return ctx

    async def default(self, language: str | None) -> Context:
        """The language's default context, made now if it has none (or it was removed)."""
        lang = normalize(language)
        async with self._making.setdefault(lang, asyncio.Lock()):
            ctx = self._all.get(self._default.get(lang, ""))
            if ctx is None:
                ctx = await self.create(lang, self.cwd)
                self._default[lang] = ctx.id
            return ctx

    def get(self, context_id: str) -> Context:
        ctx = self._all.get(context_id)
        if ctx is None:
            raise ContextNotFound(context_id)
        return ctx

    def list(self) -> list[Context]:
        return list(self._all.values())

    async def restart(self, context_id: str) -> None:
        """A fresh kernel in its place (same id, language and directory): its state is gone,
        a run in flight ends, and the sandbox's env vars are set again at its next run."""
        ctx = self.get(context_id)
        ctx.ended.set()
        async with ctx.restarting:
            try:
                await ctx.km.restart_kernel(now=True)
                await ctx.kc.wait_for_ready(timeout=START_TIMEOUT_S)
            except RuntimeError as e:
                raise ContextError(f"Failed to restart context {context_id}: {e}") from None
            finally:
                ctx.ended = asyncio.Event()
                ctx.globals_ = None

    async def remove(self, context_id: str) -> None:
        """Its run in flight ends first (its channels closed under it would cancel it)."""
        ctx = self.get(context_id)
        del self._all[context_id]
        ctx.removed = True
        ctx.ended.set()
        async with ctx.lock:
            await ctx.settle()
            await _stop(ctx)

    async def close(self) -> None:
        for ctx in list(self._all.values()):
            ctx.ended.set()
            await _stop(ctx)
        self._all.clear()


async def _stop(ctx: Context) -> None:
    ctx.kc.stop_channels()
    try:
        await ctx.km.shutdown_kernel(now=True)
    except Exception as e:  # a kernel already gone: nothing left to stop
        log.warning("context %s: shutting its kernel down: %s", ctx.id, e)
