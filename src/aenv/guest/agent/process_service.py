"""``process.Process``: the Connect service over the process table."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
from collections.abc import AsyncIterator

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof

from ..gen.process_pb import (
    CloseStdinRequest,
    CloseStdinResponse,
    ConnectRequest,
    ConnectResponse,
    ListRequest,
    ListResponse,
    ProcessEvent,
    ProcessInfo,
    ProcessSelector,
    SendInputRequest,
    SendInputResponse,
    SendSignalRequest,
    SendSignalResponse,
    Signal,
    StartRequest,
    StartResponse,
    StreamInputRequest,
    StreamInputResponse,
    UpdateRequest,
    UpdateResponse,
)
from .processes import ExitInfo, InputError, Process, ProcessNotFoundError, ProcessTable
from .state import SandboxState
from .users import (
    InvalidPathError,
    UnknownUserError,
    User,
    expand_and_resolve,
    username_from_basic_auth,
)

# The agent kills a Started process this long after its Connect-Timeout-Ms deadline, so
# the client's own deadline (which started earlier) fires first, as over a real network.
DEADLINE_GRACE_S = 0.25
# envd's keepalive period when the client sends no Keepalive-Ping-Interval header.
DEFAULT_KEEPALIVE_S = 90.0
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SIGNALS = {Signal.SIGKILL: signal.SIGKILL, Signal.SIGTERM: signal.SIGTERM}
_KEEPALIVE = ProcessEvent(event=Oneof("keepalive", ProcessEvent.KeepAlive()))


def user_path() -> str:
    """PATH for user processes: the agent's own, unless it is a bare bootstrap PATH."""
    path = os.environ.get("PATH", "")
    return path if "/usr/bin" in path.split(":") else DEFAULT_PATH


def request_user(state: SandboxState, ctx: RequestContext) -> User:
    """The user of an RPC: ``Authorization: Basic`` if given, else the default user."""
    name = username_from_basic_auth(ctx.request_headers.get("authorization"))
    try:
        return state.user(name)
    except UnknownUserError as e:
        raise ConnectError(Code.UNAUTHENTICATED, str(e)) from None


def keepalive_interval(ctx: RequestContext) -> float:
    raw = ctx.request_headers.get("keepalive-ping-interval")
    try:
        value = float(raw) if raw else DEFAULT_KEEPALIVE_S
    except ValueError:
        value = DEFAULT_KEEPALIVE_S
    return value if value > 0 else DEFAULT_KEEPALIVE_S


def _end_event(info: ExitInfo) -> ProcessEvent:
    return ProcessEvent(
        event=Oneof(
            "end",
            ProcessEvent.EndEvent(
                exit_code=info.exit_code, exited=info.exited, status=info.status, error=info.error
            ),
        )
    )


async def _events(sub_proc: Process, ctx: RequestContext) -> AsyncIterator[ProcessEvent]:
    """start, then live data, then end; keepalives during silences. At the request's
    deadline (Connect-Timeout-Ms) the stream ends with `deadline_exceeded`, as envd's
    handler returns its context's error: the SDK raises TimeoutException for it (the async
    client does not time the stream out itself)."""
    interval = keepalive_interval(ctx)
    loop = asyncio.get_running_loop()
    deadline = None if ctx.timeout_ms is None else loop.time() + ctx.timeout_ms / 1000.0
    sub = sub_proc.subscribe()
    try:
        yield ProcessEvent(event=Oneof("start", ProcessEvent.StartEvent(pid=sub_proc.pid)))
        while True:
            wait = interval if deadline is None else min(interval, deadline - loop.time())
            item = await sub.get(wait) if wait > 0 else None
            if item is None and deadline is not None and loop.time() >= deadline:
                raise ConnectError(Code.DEADLINE_EXCEEDED, "context deadline exceeded")
            if item is None:
                yield _KEEPALIVE
            elif isinstance(item, ExitInfo):
                yield _end_event(item)
                return
            else:
                kind, data = item
                yield ProcessEvent(
                    event=Oneof("data", ProcessEvent.DataEvent(output=Oneof(kind, data)))
                )
    finally:
        sub.close()


class ProcessService:
    """Implements the generated ``Process`` protocol (one instance per agent)."""

    def __init__(self, table: ProcessTable, state: SandboxState) -> None:
        self.table = table
        self.state = state

    def _select(self, selector: ProcessSelector | None) -> Process:
        which = selector.selector if selector is not None else None
        try:
            if which is None:
                raise ProcessNotFoundError("process selector is empty")
            if which.field == "pid":
                return self.table.get(pid=which.value)
            return self.table.get(tag=which.value)
        except ProcessNotFoundError as e:
            raise ConnectError(Code.NOT_FOUND, str(e)) from None

    async def list(self, request: ListRequest, ctx: RequestContext) -> ListResponse:
        return ListResponse(
            processes=[
                ProcessInfo(config=p.config, pid=p.pid, tag=p.tag) for p in self.table.running()
            ]
        )

    def _spawn(self, request: StartRequest, ctx: RequestContext) -> Process:
        user = request_user(self.state, ctx)
        config = request.process
        if config is None or not config.cmd:
            raise ConnectError(Code.INVALID_ARGUMENT, "process.cmd is required")
        try:
            cwd = expand_and_resolve(config.cwd or "", user, self.state.default_workdir)
        except InvalidPathError as e:
            raise ConnectError(Code.INVALID_ARGUMENT, str(e)) from None
        if not os.path.isdir(cwd):
            raise ConnectError(Code.INVALID_ARGUMENT, f"cwd '{cwd}' does not exist")
        env = {"PATH": user_path(), "HOME": user.home, "USER": user.name, "LOGNAME": user.name}
        env.update(self.state.env_vars)
        env.update(config.envs)
        pty_size = None
        if request.pty is not None:
            size = request.pty.size
            pty_size = (size.cols or 80, size.rows or 24) if size is not None else (80, 24)
        stdin = request.stdin if request.has_field("stdin") else True
        try:
            proc = self.table.start(
                config,
                user=user,
                env=env,
                cwd=cwd,
                tag=request.tag if request.has_field("tag") else None,
                stdin=stdin,
                pty_size=pty_size,
            )
        except OSError as e:
            code = (
                Code.RESOURCE_EXHAUSTED
                if e.errno in (errno.EAGAIN, errno.ENOMEM)
                else Code.INVALID_ARGUMENT
            )
            cmd = " ".join([config.cmd, *config.args])
            raise ConnectError(code, f"error starting process '{cmd}': {e}") from None
        except subprocess.SubprocessError as e:
            raise ConnectError(Code.INTERNAL, f"error starting process: {e}") from None
        remaining_ms = ctx.timeout_ms
        if remaining_ms is not None:
            proc.set_deadline(remaining_ms / 1000.0 + DEADLINE_GRACE_S)
        return proc

    async def start(
        self, request: StartRequest, ctx: RequestContext
    ) -> AsyncIterator[StartResponse]:
        proc = self._spawn(request, ctx)
        async for event in _events(proc, ctx):
            yield StartResponse(event=event)

    async def connect(
        self, request: ConnectRequest, ctx: RequestContext
    ) -> AsyncIterator[ConnectResponse]:
        proc = self._select(request.process)
        async for event in _events(proc, ctx):
            yield ConnectResponse(event=event)

    async def update(self, request: UpdateRequest, ctx: RequestContext) -> UpdateResponse:
        proc = self._select(request.process)
        if request.pty is not None and request.pty.size is not None:
            try:
                proc.resize(request.pty.size.cols, request.pty.size.rows)
            except InputError as e:
                raise ConnectError(Code.FAILED_PRECONDITION, str(e)) from None
        return UpdateResponse()

    async def _send(self, proc: Process, which: Oneof | None) -> None:
        if which is None:
            return
        try:
            if which.field == "pty":
                await proc.write_pty(which.value)
            else:
                await proc.write_stdin(which.value)
        except InputError as e:
            raise ConnectError(Code.FAILED_PRECONDITION, str(e)) from None

    async def send_input(self, request: SendInputRequest, ctx: RequestContext) -> SendInputResponse:
        proc = self._select(request.process)
        await self._send(proc, request.input.input if request.input is not None else None)
        return SendInputResponse()

    async def stream_input(
        self, request: AsyncIterator[StreamInputRequest], ctx: RequestContext
    ) -> StreamInputResponse:
        proc: Process | None = None
        async for msg in request:
            event = msg.event
            if event is None or event.field == "keepalive":
                continue
            if event.field == "start":
                proc = self._select(event.value.process)
            elif event.field == "data":
                if proc is None:
                    raise ConnectError(Code.FAILED_PRECONDITION, "input before start event")
                data_input = event.value.input
                await self._send(proc, data_input.input if data_input is not None else None)
        return StreamInputResponse()

    async def send_signal(
        self, request: SendSignalRequest, ctx: RequestContext
    ) -> SendSignalResponse:
        proc = self._select(request.process)
        sig = _SIGNALS.get(request.signal)
        if sig is None:
            raise ConnectError(Code.INVALID_ARGUMENT, f"invalid signal: {request.signal}")
        proc.signal(sig)
        return SendSignalResponse()

    async def close_stdin(
        self, request: CloseStdinRequest, ctx: RequestContext
    ) -> CloseStdinResponse:
        proc = self._select(request.process)
        try:
            proc.close_stdin()
        except InputError as e:
            raise ConnectError(Code.FAILED_PRECONDITION, str(e)) from None
        return CloseStdinResponse()
