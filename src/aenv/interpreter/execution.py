"""One run of code in a context, as the stream's lines (dicts): its execution count, output,
results and error, a keepalive after 5 s of silence, and always the end line last.

Env vars are set by silent runs of their own before the code (the sandbox's at the
context's first run, then the run's own) and the run's own restored by one after it, so the
code's line numbers stay its own and `execution_count` counts only what a client ran. A
client that leaves mid-run has the kernel interrupted; the next run in that context waits
for the interrupt, and skips the messages of the run it ended."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from queue import Empty
from typing import Any

from aenv.interpreter import results
from aenv.interpreter.contexts import Context
from aenv.interpreter.languages import restore_envs, set_envs

log = logging.getLogger("aenv.interpreter")

KEEPALIVE_S = 5.0
POLL_S = 0.25  # how often a silent wait looks at the context's end and the kernel's life
REPLY_WAIT_S = 2.0  # for the shell's execute_reply after the kernel went idle
ALIVE_EVERY_S = 2.0
INTERRUPTED_WAIT_S = 10.0  # for an interrupted run to end before its kernel is restarted
# Deno's kernel may publish a run's output (what it printed, from a pipe of its own, and at
# times its result) after the run's idle: its lines are taken until this long passes
# without one.
LATE_OUTPUT_S = {"javascript": 0.15, "typescript": 0.15}

# The sandbox's env vars, by access token (None: not to be had now; asked again next run).
Globals = Callable[[str | None], Awaitable[dict[str, str] | None]]


class _Run:
    """What one execute_request produced so far."""

    def __init__(self, msg_id: str) -> None:
        self.msg_id = msg_id
        self.accepted = False  # execute_input (or busy, when silent) seen
        self.errored = False
        self.done = False

    def take(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        """The line `msg` (an iopub message of this run) makes, if any."""
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status":
            state = content.get("execution_state")
            if state == "busy":
                self.accepted = True
            elif state == "idle" and self.accepted:
                self.done = True
            return None
        if kind == "execute_input":
            self.accepted = True
            return results.count(int(content.get("execution_count", 0)))
        if kind == "stream":
            return results.stream(content.get("name", "stdout"), content.get("text", ""),
                                  msg["header"].get("date"))  # fmt: skip
        if kind in ("display_data", "execute_result"):
            return results.result(content.get("data", {}), kind == "execute_result")
        if kind == "error" and not self.errored:
            self.errored = True
            return results.error(content.get("ename", ""), content.get("evalue", ""),
                                 content.get("traceback", []))  # fmt: skip
        return None


async def _lines(ctx: Context, run: _Run, ended: asyncio.Event,
                 keepalive: bool) -> AsyncIterator[dict[str, Any]]:  # fmt: skip
    """The run's lines until the kernel is idle after it; keepalives while it is silent."""
    quiet_since = alive_at = time.monotonic()
    while not run.done:
        if ended.is_set():
            yield results.error("ContextRestarting", "Context was restarted", "")
            return
        try:
            msg = await ctx.kc.get_iopub_msg(timeout=POLL_S)
        except Empty:
            msg = None
        except Exception:
            if ended.is_set():
                continue  # its channels closed under it (removed): the check above ends it
            raise
        if msg is None:
            now = time.monotonic()
            if keepalive and now - quiet_since >= KEEPALIVE_S:
                quiet_since = now
                yield results.KEEPALIVE
            if now - alive_at >= ALIVE_EVERY_S:
                alive_at = now
                if not ended.is_set() and not await ctx.km.is_alive():
                    yield await _died(ctx)
                    return
            continue
        if msg.get("parent_header", {}).get("msg_id") != run.msg_id:
            continue  # a run a client left, or a silent one's leftovers
        line = run.take(msg)
        if line is not None:
            quiet_since = time.monotonic()
            yield line
    if run.done and (late := LATE_OUTPUT_S.get(ctx.language)):
        async for line in _late(ctx, run, late):
            yield line


async def _late(ctx: Context, run: _Run, quiet_s: float) -> AsyncIterator[dict[str, Any]]:
    """A run's output published after its idle, until `quiet_s` passes without any."""
    deadline = time.monotonic() + 10 * quiet_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = await ctx.kc.get_iopub_msg(timeout=min(quiet_s, left))
        except Empty:
            return
        if msg.get("parent_header", {}).get("msg_id") == run.msg_id and \
                (line := run.take(msg)) is not None:  # fmt: skip
            yield line


async def _died(ctx: Context) -> dict[str, Any]:
    """A kernel that died mid-run (os._exit, the OOM killer): a fresh one takes its place."""
    async with ctx.restarting:
        if not await ctx.km.is_alive():  # not a client's restart, just done
            log.warning("context %s: its kernel died; restarting it", ctx.id)
            with contextlib.suppress(Exception):
                await ctx.km.restart_kernel(now=True)
                await ctx.kc.wait_for_ready(timeout=60)
            ctx.globals_ = None
    return results.error("KernelDied", "The context's kernel died and was restarted: its "
                         "state is gone", "")  # fmt: skip


async def _reply(ctx: Context, run: _Run) -> dict[str, Any] | None:
    """An error the shell's reply reports that iopub did not (an aborted run)."""
    deadline = time.monotonic() + REPLY_WAIT_S
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = await ctx.kc.get_shell_msg(timeout=left)
        except Empty:
            return None
        if msg.get("parent_header", {}).get("msg_id") != run.msg_id:
            continue  # the reply of a run a client left
        content = msg["content"]
        if content.get("status") == "abort":
            return results.error("ExecutionAborted", "Execution was aborted", "")
        if content.get("status") == "error" and not run.errored:
            return results.error(content.get("ename", ""), content.get("evalue", ""),
                                 content.get("traceback", []))  # fmt: skip
        return None
    return None


async def silently(ctx: Context, code: str | None) -> None:
    """Run housekeeping `code` in the kernel: no execution count, no history, no output."""
    if not code:
        return
    run = _Run(ctx.kc.execute(code, silent=True, store_history=False, allow_stdin=False,
                              stop_on_error=False))  # fmt: skip
    async for line in _lines(ctx, run, ctx.ended, keepalive=False):
        if line["type"] == "error":
            log.warning("context %s: housekeeping failed: %s", ctx.id, line.get("value"))
    await _reply(ctx, run)


async def execute(ctx: Context, code: str, envs: dict[str, str] | None, token: str | None,
                  globals_: Globals) -> AsyncIterator[dict[str, Any]]:  # fmt: skip
    """The lines of running `code` in `ctx`, its lock held throughout."""
    async with ctx.lock:
        if ctx.removed:  # removed while this run waited for it
            yield results.error("ContextRestarting", "Context was removed", "")
            yield results.END
            return
        await ctx.settle()
        if ctx.globals_ is None and (found := await globals_(token)) is not None:
            await silently(ctx, set_envs(ctx.language, found))
            ctx.globals_ = found
        await silently(ctx, set_envs(ctx.language, envs or {}))
        ended = ctx.ended
        run = _Run(ctx.kc.execute(code, silent=False, store_history=True, allow_stdin=False,
                                  stop_on_error=True))  # fmt: skip
        finished = False
        try:
            async for line in _lines(ctx, run, ended, keepalive=True):
                yield line
            if run.done and (line := await _reply(ctx, run)) is not None:
                yield line
            finished = True
        finally:
            # Not awaited here: a client that left cancels this generator, and each await
            # would be cancelled again. The next run in the context waits for it.
            after = _after(ctx, run, list(envs or {}), interrupt=not finished)
            ctx.settling = asyncio.get_running_loop().create_task(after)
        yield results.END


async def _after(ctx: Context, run: _Run, names: list[str], *, interrupt: bool) -> None:
    if interrupt:  # the client left: the kernel stops what it runs for nobody
        log.info("context %s: the client left mid-run; interrupting its kernel", ctx.id)
        await ctx.km.interrupt_kernel()
        # Until it has ended: a kernel aborts what was sent while a run failed, so the next
        # run would come back empty. One that ignores the interrupt is replaced.
        try:
            async with asyncio.timeout(INTERRUPTED_WAIT_S):
                async for _ in _lines(ctx, run, ctx.ended, keepalive=False):
                    pass
                await _reply(ctx, run)
        except TimeoutError:
            log.warning("context %s: its kernel ignored the interrupt; restarting it", ctx.id)
            async with ctx.restarting:
                await ctx.km.restart_kernel(now=True)
                await ctx.kc.wait_for_ready(timeout=60)
            ctx.globals_ = None
            return
    if names:
        await silently(ctx, restore_envs(ctx.language, names, ctx.globals_ or {}))
