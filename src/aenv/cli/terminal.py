"""An interactive shell in a sandbox, as `ssh` gives one.

The local terminal goes into raw mode, so every key (Ctrl-C, Ctrl-D, Ctrl-Z, arrows) is sent
to the shell in the sandbox's PTY and handled there, as over ssh: Ctrl-C interrupts the remote
command, Ctrl-D at an empty prompt ends the shell. The window size follows the local one
(SIGWINCH). ssh's escapes work at the start of a line: `~.` disconnects (the remote shell is
killed), `~~` sends one `~`, `~?` lists them. While attached, the sandbox's TTL is kept at
least KEEPALIVE_TTL_S ahead, so a session never expires under the user.

The exit status is the remote shell's; 255 when the connection was lost (as ssh).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator
from typing import Any

from aenv.cli.envd import Envd, EnvdError, unb64
from aenv.cli.errors import CliError

KEEPALIVE_EVERY_S = 20.0
KEEPALIVE_TTL_S = 60
EXIT_LOST = 255
HELP = (b"\r\nSupported escape sequences:\r\n"
        b" ~.   - terminate the session\r\n"
        b" ~?   - this message\r\n"
        b" ~~   - send the escape character by typing it twice\r\n"
        b"(Note that escapes are only recognized immediately after newline.)\r\n")  # fmt: skip


def terminal_size(fd: int) -> tuple[int, int]:
    """(cols, rows) of the terminal on fd (80x24 if it has none)."""
    try:
        size = os.get_terminal_size(fd)
        return max(size.columns, 1), max(size.lines, 1)
    except OSError:
        return 80, 24


class EscapeFilter:
    """ssh's `~` escapes, recognised right after a newline (and at the very start)."""

    def __init__(self) -> None:
        self.line_start = True
        self.pending = False

    def feed(self, data: bytes) -> tuple[bytes, str | None]:
        """(bytes to send, action or None); the action is 'detach' or 'help'."""
        out = bytearray()
        action = None
        for b in data:
            if self.pending:
                self.pending = False
                if b == ord("."):
                    return bytes(out), "detach"
                if b == ord("?"):
                    action = "help"
                    continue
                if b == ord("~"):
                    out.append(b)
                    self.line_start = False
                    continue
                out.append(ord("~"))
            elif self.line_start and b == ord("~"):
                self.pending = True
                continue
            out.append(b)
            self.line_start = b in (0x0D, 0x0A)
        return bytes(out), action


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        view = view[n:]


class _Output(threading.Thread):
    """Copies the PTY's output to the terminal until the shell ends or the stream breaks."""

    def __init__(self, events: Iterator[dict[str, Any]], fd: int, wake: int) -> None:
        super().__init__(daemon=True, name="pty-output")
        self.events = events
        self.fd = fd
        self.wake = wake
        self.exit_code: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for msg in self.events:
                event = msg.get("event") or {}
                if "data" in event:
                    data = event["data"]
                    chunk = unb64(data.get("pty") or data.get("stdout") or data.get("stderr"))
                    if chunk:
                        _write_all(self.fd, chunk)
                elif "end" in event:
                    self.exit_code = exit_status(event["end"])
        except BaseException as e:
            self.error = e
        finally:
            with contextlib.suppress(OSError):
                os.write(self.wake, b"x")


def exit_status(end: dict[str, Any]) -> int:
    """A local exit status for an EndEvent: the code, or 128+signal as a shell reports it."""
    if end.get("exited", False) or ("exitCode" in end and end["exitCode"] >= 0):
        return int(end.get("exitCode", 0)) & 0xFF
    status = str(end.get("status") or end.get("error") or "")
    for name, num in (("killed", 9), ("terminated", 15), ("interrupt", 2), ("hangup", 1),
                      ("segmentation fault", 11), ("aborted", 6), ("broken pipe", 13),
                      ("quit", 3), ("alarm clock", 14), ("user defined signal 1", 10),
                      ("user defined signal 2", 12)):  # fmt: skip
        if status.endswith(name):
            return 128 + num
    return EXIT_LOST


def shell(envd: Envd, *, keepalive: Callable[[], None] | None = None,
          cmd: str = "/bin/bash", args: list[str] | None = None) -> int:
    """Run an interactive login shell in the sandbox on this terminal; its exit status."""
    in_fd, out_fd = sys.stdin.fileno(), sys.stdout.fileno()
    if not (os.isatty(in_fd) and os.isatty(out_fd)):
        raise CliError("an interactive shell needs a terminal on stdin and stdout; "
                       "use `aenv exec ID -- CMD` to run a command")  # fmt: skip
    envs = {
        "TERM": os.environ.get("TERM") or "xterm-256color",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
    }
    cols, rows = terminal_size(out_fd)
    with envd.start(cmd, args if args is not None else ["-i", "-l"], envs=envs,
                    pty=(cols, rows)) as events:  # fmt: skip
        first = next(events, None)
        start = (first or {}).get("event", {}).get("start")
        if not start or "pid" not in start:
            raise CliError(f"the sandbox did not start a shell (got {first!r})")
        return _session(envd, int(start["pid"]), events, in_fd, out_fd, keepalive)


def _session(envd: Envd, pid: int, events: Iterator[dict[str, Any]], in_fd: int, out_fd: int,
             keepalive: Callable[[], None] | None) -> int:
    wake_r, wake_w = os.pipe()
    sig_r, sig_w = os.pipe()
    os.set_blocking(sig_w, False)

    def on_signal(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            os.write(sig_w, bytes([signum]))

    # SIGWINCH: resize. SIGHUP (the terminal went away) and SIGTERM: end the session the
    # way `~.` does, so the caller's clean-up (removing a `start` sandbox) still runs.
    handled = (signal.SIGWINCH, signal.SIGHUP, signal.SIGTERM)
    old_handlers = {sig: signal.signal(sig, on_signal) for sig in handled}
    ended_by: int | None = None
    output = _Output(events, out_fd, wake_w)
    escapes = EscapeFilter()
    detached = False
    next_keepalive = time.monotonic() + KEEPALIVE_EVERY_S
    try:
        with raw_mode(in_fd):
            output.start()
            while True:
                wait = max(0.0, next_keepalive - time.monotonic()) if keepalive else None
                ready, _, _ = select.select([in_fd, wake_r, sig_r], [], [], wait)
                if wake_r in ready:
                    break
                if sig_r in ready:
                    signals = set(os.read(sig_r, 1024))
                    ended_by = next((s for s in (signal.SIGHUP, signal.SIGTERM)
                                     if s in signals), None)  # fmt: skip
                    if ended_by is not None:
                        detached = True
                        break
                    cols, rows = terminal_size(out_fd)
                    with contextlib.suppress(EnvdError):
                        envd.resize(pid, cols, rows)
                if in_fd in ready:
                    data = os.read(in_fd, 65536)
                    if not data:  # the terminal went away
                        detached = True
                        break
                    send, action = escapes.feed(data)
                    if send:
                        try:
                            envd.send_input(pid, send, pty=True)
                        except EnvdError:
                            if not output.is_alive():
                                break
                            raise
                    if action == "help":
                        _write_all(out_fd, HELP)
                    elif action == "detach":
                        detached = True
                        break
                if keepalive and time.monotonic() >= next_keepalive:
                    next_keepalive = time.monotonic() + KEEPALIVE_EVERY_S
                    with contextlib.suppress(CliError):
                        keepalive()
            if detached:
                with contextlib.suppress(CliError):
                    envd.signal(pid, "SIGKILL")
                output.join(2.0)
    finally:
        for sig, old in old_handlers.items():
            signal.signal(sig, old)
        for fd in (wake_r, wake_w, sig_r, sig_w):
            with contextlib.suppress(OSError):
                os.close(fd)
    if ended_by is not None:
        return 128 + ended_by
    if detached:
        with contextlib.suppress(OSError):
            sys.stderr.write(f"Connection to sandbox {envd.sandbox_id} closed.\n")
            sys.stderr.flush()
        return EXIT_LOST
    output.join(5.0)
    if output.exit_code is not None:
        return output.exit_code
    if isinstance(output.error, CliError):
        raise CliError(output.error.message, EXIT_LOST)
    raise CliError(f"lost the connection to sandbox {envd.sandbox_id}", EXIT_LOST)
