"""PTYs: create, input, resize, output (sync and async)."""

from __future__ import annotations

import asyncio

import pytest
from e2b import AsyncSandbox, CommandExitException, Sandbox
from e2b.sandbox.commands.command_handle import PtySize


def _read_until(h, out: bytearray, needle: bytes) -> None:  # type: ignore[no-untyped-def]
    for _stdout, _stderr, pty in h:
        if pty:
            out.extend(pty)
            if needle in out:
                return
    raise AssertionError(f"{needle!r} not in PTY output {bytes(out)!r}")


def test_pty_create_input_resize_output(sbx: Sandbox) -> None:
    h = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.send_stdin(h.pid, b"stty size; tty; echo $TERM; echo first-$((1+1))\n")
    out = bytearray()
    _read_until(h, out, b"first-2")
    text = out.decode(errors="replace")
    assert "24 80" in text and "/dev/pts/" in text and "xterm-256color" in text
    sbx.pty.resize(h.pid, PtySize(rows=50, cols=132))
    sbx.pty.send_stdin(h.pid, b"stty size; exit 0\n")
    rest = bytearray()
    result = h.wait(on_pty=rest.extend)
    assert result.exit_code == 0
    assert "50 132" in rest.decode(errors="replace")


def test_pty_kill(sbx: Sandbox) -> None:
    h = sbx.pty.create(PtySize(rows=10, cols=40))
    assert sbx.pty.kill(h.pid) is True
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert ei.value.error == "signal: killed"
    assert sbx.pty.kill(h.pid) is False


async def test_async_pty(asbx: AsyncSandbox) -> None:
    out = bytearray()
    done = asyncio.Event()

    def on_data(data: bytes) -> None:
        out.extend(data)
        if b"marker-42" in out:
            done.set()

    h = await asbx.pty.create(PtySize(rows=24, cols=80), on_data=on_data)
    await asbx.pty.send_stdin(h.pid, b"echo marker-$((40+2))\n")
    await asyncio.wait_for(done.wait(), 5)
    await asbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
    await asbx.pty.send_stdin(h.pid, b"stty size; exit 0\n")
    result = await h.wait()
    assert result.exit_code == 0
    assert b"30 100" in out
