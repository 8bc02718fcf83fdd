"""commands.* through the unmodified SDK (AsyncSandbox): checklist items 4 and 5."""

from __future__ import annotations

import asyncio
import time

import pytest
from e2b import AsyncSandbox, CommandExitException, NotFoundException, TimeoutException


async def test_run_with_callbacks(asbx: AsyncSandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    r = await asbx.commands.run(
        "echo hi; echo oops >&2", on_stdout=out.append, on_stderr=err.append
    )
    assert (r.stdout, r.stderr, r.exit_code) == ("hi\n", "oops\n", 0)
    assert "".join(out) == "hi\n" and "".join(err) == "oops\n"


async def test_nonzero_exit(asbx: AsyncSandbox) -> None:
    with pytest.raises(CommandExitException) as ei:
        await asbx.commands.run("exit 7")
    assert (ei.value.exit_code, ei.value.error) == (7, "exit status 7")


async def test_timeout_kills_the_process(asbx: AsyncSandbox) -> None:
    # The async SDK does not time a silent stream out itself: the agent ends the stream with
    # deadline_exceeded at the deadline (as envd), which the SDK raises as a timeout, and
    # kills the process just after.
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        await asbx.commands.run("sleep 10", timeout=1)
    assert time.monotonic() - t0 < 5
    # Killed, not left behind (a moment after the deadline).
    gone = await asbx.commands.run("for i in $(seq 50); do pgrep -x sleep || exit 0; "
                                   "sleep 0.1; done; exit 1")
    assert gone.exit_code == 0


async def test_background_kill_list_connect(asbx: AsyncSandbox) -> None:
    h = await asbx.commands.run("sleep 30", background=True)
    assert h.pid in {p.pid for p in await asbx.commands.list()}
    h2 = await asbx.commands.connect(h.pid)
    assert await h.kill() is True
    with pytest.raises(CommandExitException):
        await h.wait()
    with pytest.raises(CommandExitException):
        await h2.wait()
    assert await asbx.commands.kill(999_999) is False
    with pytest.raises(NotFoundException):
        await asbx.commands.connect(999_999)


async def test_stdin(asbx: AsyncSandbox) -> None:
    h = await asbx.commands.run("read x; echo got $x", background=True, stdin=True)
    await asbx.commands.send_stdin(h.pid, "abc\n")
    r = await h.wait()
    assert r.stdout == "got abc\n"


async def test_concurrent_commands(asbx: AsyncSandbox) -> None:
    results = await asyncio.gather(*(asbx.commands.run(f"echo {i}") for i in range(8)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
