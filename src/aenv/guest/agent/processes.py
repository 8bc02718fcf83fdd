"""User processes: output fan-out to streams, input, exit and kill.

Output is read from non-blocking pipes (or the PTY master) in chunks of at most 32 KiB
(16 KiB for PTYs) and handed to every subscribed stream. Memory stays bounded: when any
subscriber has more than ``HIGH_WATER`` bytes queued, reading stops (the process blocks
on a full pipe) until it drains. With no subscriber, output is read and dropped, as envd
does. When the process exits, what is already in its pipes is drained, then the single
end event is published; output a surviving background child writes later is not
(envd closes the pipes at exit too).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import struct
import termios
from collections import deque
from dataclasses import dataclass

from ..gen.process_pb import ProcessConfig
from .journal import START_CMD_TAG, Journal
from .spawn import SpawnPolicy, spawn
from .users import User

STD_CHUNK = 32 * 1024
PTY_CHUNK = 16 * 1024
HIGH_WATER = 1024 * 1024
LOW_WATER = 256 * 1024
# At exit, read at most this much per stream (a pipe holds 64 KiB, at most 1 MiB if resized).
EXIT_DRAIN_LIMIT = 1024 * 1024

# Go's syscall.Signal.String() on Linux: ProcessState.String() says "signal: <this>".
_GO_SIGNAL_NAMES = {
    1: "hangup",
    2: "interrupt",
    3: "quit",
    4: "illegal instruction",
    5: "trace/breakpoint trap",
    6: "aborted",
    7: "bus error",
    8: "floating point exception",
    9: "killed",
    10: "user defined signal 1",
    11: "segmentation fault",
    12: "user defined signal 2",
    13: "broken pipe",
    14: "alarm clock",
    15: "terminated",
    16: "stack fault",
    17: "child exited",
    18: "continued",
    19: "stopped (signal)",
    20: "stopped",
    21: "stopped (tty input)",
    22: "stopped (tty output)",
    23: "urgent I/O condition",
    24: "CPU time limit exceeded",
    25: "file size limit exceeded",
    26: "virtual timer expired",
    27: "profiling timer expired",
    28: "window changed",
    29: "I/O possible",
    30: "power failure",
    31: "bad system call",
}


@dataclass(frozen=True, slots=True)
class ExitInfo:
    """How a process ended, as Go's ``ProcessState`` reports it (the EndEvent fields)."""

    exit_code: int
    exited: bool
    status: str
    error: str | None

    @classmethod
    def from_wait_status(cls, status: int) -> ExitInfo:
        if os.WIFEXITED(status):
            code = os.WEXITSTATUS(status)
            text = f"exit status {code}"
            return cls(code, True, text, None if code == 0 else text)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            text = "signal: " + _GO_SIGNAL_NAMES.get(sig, f"signal {sig}")
            if os.WCOREDUMP(status):
                text += " (core dumped)"
            return cls(-1, False, text, text)
        return cls(-1, False, f"unknown wait status {status}", f"unknown wait status {status}")


class ProcessNotFoundError(LookupError):
    """No running process matches the selector."""


class InputError(Exception):
    """Input cannot be delivered (stdin not enabled/closed, or wrong kind for a PTY)."""


# A subscriber receives ("stdout"|"stderr"|"pty", bytes) tuples, then one ExitInfo.
Item = tuple[str, bytes] | ExitInfo


class Subscription:
    """One stream's live view of a process. Close it when the stream ends."""

    __slots__ = ("_items", "_proc", "_waiter", "closed", "queued")

    def __init__(self, proc: Process) -> None:
        self._proc = proc
        self._items: deque[Item] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.queued = 0
        self.closed = False

    def push(self, item: Item) -> None:
        self._items.append(item)
        if not isinstance(item, ExitInfo):
            self.queued += len(item[1])
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def get(self, timeout: float | None) -> Item | None:
        """The next item, or None if ``timeout`` seconds pass without one."""
        if not self._items:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
            if not self._items:
                return None
        item = self._items.popleft()
        if not isinstance(item, ExitInfo):
            self.queued -= len(item[1])
            if self.queued < LOW_WATER:
                self._proc.maybe_resume()
        return item

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._items.clear()
            self.queued = 0
            self._proc.unsubscribe(self)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Process:
    """A running user process started by ``Start``. Valid until its end is published."""

    def __init__(
        self,
        table: ProcessTable,
        popen: object,
        pid: int,
        config: ProcessConfig,
        tag: str | None,
        outputs: dict[int, str],
        stdin_fd: int | None,
        pty_fd: int | None,
    ) -> None:
        self._table = table
        self._loop = table.loop
        self._popen = popen
        self.pid = pid
        self.config = config
        self.tag = tag
        self.pty_fd = pty_fd
        self.stdin_fd = stdin_fd
        self._outputs = outputs  # fd -> kind
        self._subs: set[Subscription] = set()
        self._paused = False
        self._exit: ExitInfo | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._input_lock = asyncio.Lock()
        self.finished = False
        for fd, kind in outputs.items():
            self._loop.add_reader(fd, self._on_readable, fd, kind)

    # --- output ---------------------------------------------------------------------------

    def subscribe(self) -> Subscription:
        sub = Subscription(self)
        self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subs.discard(sub)
        self.maybe_resume()

    def _read(self, fd: int, kind: str) -> bytes | None:
        """One chunk; b"" at EOF (or EIO: PTY slave closed); None if nothing is ready."""
        try:
            return os.read(fd, PTY_CHUNK if kind == "pty" else STD_CHUNK)
        except BlockingIOError:
            return None
        except OSError as e:
            if e.errno in (errno.EIO, errno.EBADF):
                return b""
            raise

    def _on_readable(self, fd: int, kind: str) -> None:
        data = self._read(fd, kind)
        if data is None:
            return
        if not data:
            self._close_output(fd)
            return
        self._publish(kind, data)
        if any(s.queued > HIGH_WATER for s in self._subs):
            self._pause()

    def _publish(self, kind: str, data: bytes) -> None:
        if self.tag == START_CMD_TAG:  # the template's start command: its sandbox's log
            self._table.journal.output(self.pid, kind, data)
        for sub in self._subs:
            sub.push((kind, data))

    def _pause(self) -> None:
        if not self._paused:
            self._paused = True
            for fd in self._outputs:
                self._loop.remove_reader(fd)

    def maybe_resume(self) -> None:
        if self._paused and all(s.queued < LOW_WATER for s in self._subs):
            self._paused = False
            for fd, kind in self._outputs.items():
                self._loop.add_reader(fd, self._on_readable, fd, kind)

    def _close_output(self, fd: int) -> None:
        kind = self._outputs.pop(fd, None)
        if kind is None:
            return
        self._loop.remove_reader(fd)
        if kind != "pty":  # the PTY master also carries input; closed at the end
            os.close(fd)

    # --- lifecycle --------------------------------------------------------------------------

    def set_deadline(self, seconds: float) -> None:
        """SIGKILL this process (only its own pid) when ``seconds`` pass."""
        self._deadline = self._loop.call_later(max(seconds, 0.0), self._kill_at_deadline)

    def _kill_at_deadline(self) -> None:
        self._deadline = None
        self.signal(signal.SIGKILL)

    def signal(self, sig: int) -> None:
        if self._exit is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def exited(self, status: int) -> None:
        """Called by the table when ``waitpid`` reported this pid."""
        self._exit = ExitInfo.from_wait_status(status)
        if self._popen is not None:
            self._popen.returncode = os.waitstatus_to_exitcode(status)  # type: ignore[attr-defined]
        # What the process wrote before exiting is already in the pipe (or the PTY's
        # buffer, which a read flushes); take it all regardless of back-pressure.
        # Bounded: a surviving background child may keep writing into the same pipe.
        for fd, kind in list(self._outputs.items()):
            left = EXIT_DRAIN_LIMIT
            while left > 0:
                try:
                    data = self._read(fd, kind)
                except OSError:
                    data = b""
                if not data:
                    break
                left -= len(data)
                self._publish(kind, data)
            self._close_output(fd)
        self._finish()

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        assert self._exit is not None
        if self.tag == START_CMD_TAG:
            self._table.journal.ended(self.pid, self._exit.status)
        for sub in list(self._subs):
            sub.push(self._exit)
        self._subs.clear()
        for fd in (self.stdin_fd, self.pty_fd):
            if fd is not None:
                self._loop.remove_writer(fd)
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.stdin_fd = self.pty_fd = None
        self._table.forget(self)

    # --- input ------------------------------------------------------------------------------

    async def write_stdin(self, data: bytes) -> None:
        if self.pty_fd is not None:
            raise InputError("tty assigned to process - input should be written to the pty")
        await self._write(lambda: self.stdin_fd, data, "stdin not enabled or closed")

    async def write_pty(self, data: bytes) -> None:
        if self.pty_fd is None:
            raise InputError("tty not assigned to process - input should be written to stdin")
        await self._write(lambda: self.pty_fd, data, "tty closed")

    async def _write(self, get_fd, data: bytes, closed_msg: str) -> None:  # type: ignore[no-untyped-def]
        async with self._input_lock:
            view = memoryview(data)
            while view:
                fd = get_fd()
                if fd is None:
                    raise InputError(closed_msg)
                try:
                    n = os.write(fd, view)
                except BlockingIOError:
                    ready = self._loop.create_future()
                    self._loop.add_writer(fd, lambda f=ready: f.done() or f.set_result(None))
                    try:
                        await ready
                    finally:
                        if get_fd() == fd:
                            self._loop.remove_writer(fd)
                    continue
                except OSError as e:
                    raise InputError(f"error writing input of process {self.pid}: {e}") from e
                view = view[n:]

    def close_stdin(self) -> None:
        if self.pty_fd is not None:
            raise InputError("cannot close stdin for PTY process - send Ctrl+D (0x04) instead")
        fd, self.stdin_fd = self.stdin_fd, None
        if fd is not None:
            self._loop.remove_writer(fd)
            os.close(fd)

    def resize(self, cols: int, rows: int) -> None:
        if self.pty_fd is None:
            raise InputError("tty not assigned to process")
        set_winsize(self.pty_fd, cols, rows)


def set_winsize(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class ProcessTable:
    """The running processes by pid, and the SIGCHLD reaper. One per agent."""

    def __init__(self, loop: asyncio.AbstractEventLoop, policy: SpawnPolicy,
                 journal: Journal | None = None) -> None:  # fmt: skip
        self.loop = loop
        self.policy = policy
        self.journal = journal or Journal()
        self._by_pid: dict[int, Process] = {}
        loop.add_signal_handler(signal.SIGCHLD, self.reap)

    def start(
        self,
        config: ProcessConfig,
        *,
        user: User,
        env: dict[str, str],
        cwd: str,
        tag: str | None,
        stdin: bool,
        pty_size: tuple[int, int] | None,
    ) -> Process:
        """Spawn ``config.cmd config.args``. Raises OSError if it cannot be started."""
        argv = [config.cmd, *config.args]
        to_close: list[int] = []
        try:
            if pty_size is not None:
                master, slave = os.openpty()
                to_close.append(slave)
                os.set_blocking(master, False)
                set_winsize(slave, *pty_size)
                try:
                    popen = spawn(
                        argv,
                        env=env,
                        cwd=cwd,
                        user=user,
                        stdin=slave,
                        stdout=slave,
                        stderr=slave,
                        policy=self.policy,
                        ctty=True,
                    )
                except BaseException:
                    os.close(master)
                    raise
                outputs = {master: "pty"}
                stdin_fd, pty_fd = None, master
            else:
                out_r, out_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                to_close.append(out_w)
                err_r, err_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
                to_close.append(err_w)
                os.set_blocking(out_w, True)
                os.set_blocking(err_w, True)
                parents = [out_r, err_r]
                if stdin:
                    in_r, in_w = os.pipe2(os.O_CLOEXEC)
                    to_close.append(in_r)
                    os.set_blocking(in_w, False)
                    parents.append(in_w)
                    child_in = in_r
                else:
                    child_in = subprocess_devnull()
                    to_close.append(child_in)
                try:
                    popen = spawn(
                        argv,
                        env=env,
                        cwd=cwd,
                        user=user,
                        stdin=child_in,
                        stdout=out_w,
                        stderr=err_w,
                        policy=self.policy,
                    )
                except BaseException:
                    for fd in parents:
                        os.close(fd)
                    raise
                outputs = {out_r: "stdout", err_r: "stderr"}
                stdin_fd, pty_fd = (parents[2] if stdin else None), None
        finally:
            for fd in to_close:
                os.close(fd)
        proc = Process(self, popen, popen.pid, config, tag, outputs, stdin_fd, pty_fd)
        self._by_pid[proc.pid] = proc
        return proc

    def reap(self) -> None:
        """Collect every exited child (also orphans, when the agent is a PID 1)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            proc = self._by_pid.get(pid)
            if proc is not None:
                proc.exited(status)

    def forget(self, proc: Process) -> None:
        if self._by_pid.get(proc.pid) is proc:
            del self._by_pid[proc.pid]

    def get(self, pid: int | None = None, tag: str | None = None) -> Process:
        if pid is not None:
            proc = self._by_pid.get(pid)
            if proc is not None and not proc.finished:
                return proc
            raise ProcessNotFoundError(f"process with pid {pid} not found")
        for proc in self._by_pid.values():
            if tag is not None and proc.tag == tag and not proc.finished:
                return proc
        raise ProcessNotFoundError(f"process with tag {tag} not found")

    def running(self) -> list[Process]:
        return [p for p in self._by_pid.values() if not p.finished]

    def kill_all(self) -> None:
        for proc in self.running():
            proc.signal(signal.SIGKILL)


def subprocess_devnull() -> int:
    return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
