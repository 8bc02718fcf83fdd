"""``filesystem.Filesystem``: Stat, MakeDir, Move, ListDir, Remove and the watchers."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import AsyncIterator

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof

from ..gen.filesystem_pb import (
    CreateWatcherRequest,
    CreateWatcherResponse,
    GetWatcherEventsRequest,
    GetWatcherEventsResponse,
    ListDirRequest,
    ListDirResponse,
    MakeDirRequest,
    MakeDirResponse,
    MoveRequest,
    MoveResponse,
    RemoveRequest,
    RemoveResponse,
    RemoveWatcherRequest,
    RemoveWatcherResponse,
    StatRequest,
    StatResponse,
    WatchDirRequest,
    WatchDirResponse,
)
from .entries import entry_info, walk
from .fsops import ensure_dirs, remove_all
from .process_service import keepalive_interval, request_user
from .state import SandboxState
from .users import InvalidPathError, expand_and_resolve
from .watchers import Watcher, WatcherRegistry, is_network_fs, mount_fstype

_WATCH_KEEPALIVE = WatchDirResponse(event=Oneof("keepalive", WatchDirResponse.KeepAlive()))


def _os_error(e: OSError, path: str) -> ConnectError:
    if isinstance(e, FileNotFoundError):
        return ConnectError(Code.NOT_FOUND, f"path '{path}' does not exist")
    if isinstance(e, NotADirectoryError):
        return ConnectError(Code.INVALID_ARGUMENT, f"path '{path}' is not a directory: {e}")
    if isinstance(e, PermissionError):
        return ConnectError(Code.PERMISSION_DENIED, f"permission denied: {path}")
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return ConnectError(Code.RESOURCE_EXHAUSTED, f"not enough disk space: {e}")
    return ConnectError(Code.INTERNAL, f"error on '{path}': {e}")


class FilesystemService:
    """Implements the generated ``Filesystem`` protocol (one instance per agent)."""

    def __init__(self, state: SandboxState, watchers: WatcherRegistry) -> None:
        self.state = state
        self.watchers = watchers

    def _path(self, path: str, ctx: RequestContext) -> tuple[str, object]:
        user = request_user(self.state, ctx)
        try:
            return expand_and_resolve(path, user, self.state.default_workdir), user
        except InvalidPathError as e:
            raise ConnectError(Code.INVALID_ARGUMENT, str(e)) from None

    async def stat(self, request: StatRequest, ctx: RequestContext) -> StatResponse:
        path, _ = self._path(request.path, ctx)
        try:
            return StatResponse(entry=entry_info(path))
        except OSError as e:
            raise _os_error(e, path) from None

    async def make_dir(self, request: MakeDirRequest, ctx: RequestContext) -> MakeDirResponse:
        path, user = self._path(request.path, ctx)
        try:
            if os.path.isdir(path):
                raise ConnectError(Code.ALREADY_EXISTS, f"directory '{path}' already exists")
            if os.path.lexists(path):
                raise ConnectError(
                    Code.INVALID_ARGUMENT, f"path '{path}' already exists and is not a directory"
                )
            ensure_dirs(path, user)  # type: ignore[arg-type]
            entry = entry_info(path)
        except NotADirectoryError as e:
            raise ConnectError(Code.INVALID_ARGUMENT, str(e)) from None
        except OSError as e:
            raise _os_error(e, path) from None
        finally:
            self.watchers.drain_all()
        return MakeDirResponse(entry=entry)

    async def move(self, request: MoveRequest, ctx: RequestContext) -> MoveResponse:
        source, user = self._path(request.source, ctx)
        dest, _ = self._path(request.destination, ctx)
        try:
            if not os.path.lexists(source):
                raise ConnectError(Code.NOT_FOUND, f"source '{source}' does not exist")
            ensure_dirs(os.path.dirname(dest), user)  # type: ignore[arg-type]
            os.rename(source, dest)
            entry = entry_info(dest)
        except NotADirectoryError as e:
            raise ConnectError(Code.INVALID_ARGUMENT, str(e)) from None
        except OSError as e:
            raise _os_error(e, source) from None
        finally:
            self.watchers.drain_all()
        return MoveResponse(entry=entry)

    async def list_dir(self, request: ListDirRequest, ctx: RequestContext) -> ListDirResponse:
        path, _ = self._path(request.path, ctx)
        depth = request.depth or 1
        try:
            if not os.path.isdir(path):  # follows a symlinked root, like envd
                if not os.path.lexists(path):
                    raise ConnectError(Code.NOT_FOUND, f"path '{path}' does not exist")
                raise ConnectError(Code.INVALID_ARGUMENT, f"path '{path}' is not a directory")
            return ListDirResponse(entries=list(walk(path, depth)))
        except OSError as e:
            raise _os_error(e, path) from None

    async def remove(self, request: RemoveRequest, ctx: RequestContext) -> RemoveResponse:
        path, _ = self._path(request.path, ctx)
        try:
            remove_all(path)
        except OSError as e:
            raise _os_error(e, path) from None
        finally:
            self.watchers.drain_all()
        return RemoveResponse()

    def _open_watcher(
        self,
        request: WatchDirRequest | CreateWatcherRequest,
        ctx: RequestContext,
        *,
        polled: bool,
        on_events: object = None,
    ) -> Watcher:
        path, _ = self._path(request.path, ctx)
        if not os.path.lexists(path):
            raise ConnectError(Code.NOT_FOUND, f"path '{path}' does not exist")
        if not os.path.isdir(path):
            raise ConnectError(Code.INVALID_ARGUMENT, f"path '{path}' is not a directory")
        if not request.allow_network_mounts:
            fstype = mount_fstype(os.path.realpath(path))
            if is_network_fs(fstype):
                raise ConnectError(
                    Code.INVALID_ARGUMENT,
                    f"path '{path}' is on a network filesystem ({fstype}); "
                    "set allow_network_mounts to watch it",
                )
        try:
            return self.watchers.open(
                path,
                recursive=request.recursive,
                include_entry=request.include_entry,
                polled=polled,
                on_events=on_events,  # type: ignore[arg-type]
            )
        except OSError as e:
            raise _os_error(e, path) from None

    async def watch_dir(
        self, request: WatchDirRequest, ctx: RequestContext
    ) -> AsyncIterator[WatchDirResponse]:
        wakeup = asyncio.Event()
        watcher = self._open_watcher(request, ctx, polled=False, on_events=wakeup.set)
        interval = keepalive_interval(ctx)
        try:
            yield WatchDirResponse(event=Oneof("start", WatchDirResponse.StartEvent()))
            while True:
                wakeup.clear()
                for event in watcher.take():
                    yield WatchDirResponse(event=Oneof("filesystem", event))
                if watcher.ended:
                    return
                try:
                    await asyncio.wait_for(wakeup.wait(), interval)
                except TimeoutError:
                    yield _WATCH_KEEPALIVE
        finally:
            self.watchers.close(watcher)

    async def create_watcher(
        self, request: CreateWatcherRequest, ctx: RequestContext
    ) -> CreateWatcherResponse:
        watcher = self._open_watcher(request, ctx, polled=True)
        return CreateWatcherResponse(watcher_id=watcher.id)

    def _polled(self, watcher_id: str) -> Watcher:
        watcher = self.watchers.polled.get(watcher_id)
        if watcher is None:
            raise ConnectError(Code.NOT_FOUND, f"watcher with id {watcher_id} not found")
        return watcher

    async def get_watcher_events(
        self, request: GetWatcherEventsRequest, ctx: RequestContext
    ) -> GetWatcherEventsResponse:
        return GetWatcherEventsResponse(events=self._polled(request.watcher_id).take())

    async def remove_watcher(
        self, request: RemoveWatcherRequest, ctx: RequestContext
    ) -> RemoveWatcherResponse:
        self.watchers.close(self._polled(request.watcher_id))
        return RemoveWatcherResponse()
