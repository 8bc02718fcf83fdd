"""watch_dir: sync polling watchers (CreateWatcher/GetWatcherEvents/RemoveWatcher) and the
async WatchDir stream, backed by inotify (checklist item 13)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from e2b import (
    AsyncSandbox,
    FileNotFoundException,
    FilesystemEventType,
    InvalidArgumentException,
    Sandbox,
)

T = FilesystemEventType


def test_new_upload_yields_exactly_create_chmod_write(sbx: Sandbox, workdir: str) -> None:
    wh = sbx.files.watch_dir(workdir)
    sbx.files.write(f"{workdir}/f.txt", "1")
    events = wh.get_new_events()  # no sleep: the write's events are already queued
    assert [(e.name, e.type) for e in events] == [
        ("f.txt", T.CREATE), ("f.txt", T.CHMOD), ("f.txt", T.WRITE)
    ]  # fmt: skip
    assert wh.get_new_events() == []
    sbx.files.write(f"{workdir}/f.txt", "22")
    assert T.WRITE in {e.type for e in wh.get_new_events()}
    sbx.files.rename(f"{workdir}/f.txt", f"{workdir}/g.txt")
    assert [(e.name, e.type) for e in wh.get_new_events()] == [
        ("f.txt", T.RENAME), ("g.txt", T.CREATE)
    ]  # fmt: skip
    sbx.files.remove(f"{workdir}/g.txt")
    assert [(e.name, e.type) for e in wh.get_new_events()] == [("g.txt", T.REMOVE)]
    wh.stop()


def test_recursive_watch_with_entries(sbx: Sandbox, workdir: str) -> None:
    sbx.files.make_dir(f"{workdir}/nested")
    wh = sbx.files.watch_dir(workdir, recursive=True, include_entry=True)
    sbx.files.write(f"{workdir}/nested/file.txt", "abc")
    sbx.files.make_dir(f"{workdir}/nested/new/deeper")
    sbx.files.write(f"{workdir}/nested/new/deeper/x", "x")
    events = wh.get_new_events()
    names = [(e.name, e.type) for e in events]
    assert names[:3] == [
        ("nested/file.txt", T.CREATE), ("nested/file.txt", T.CHMOD), ("nested/file.txt", T.WRITE)
    ]  # fmt: skip
    assert ("nested/new", T.CREATE) in names
    assert ("nested/new/deeper/x", T.WRITE) in names
    write = next(e for e in events if e.type == T.WRITE)
    assert write.entry is not None and write.entry.size == 3
    assert write.entry.path == f"/home/user/{workdir}/nested/file.txt"
    wh.stop()


def test_watch_errors(sbx: Sandbox, workdir: str) -> None:
    with pytest.raises(FileNotFoundException):
        sbx.files.watch_dir(f"{workdir}/missing")
    sbx.files.write(f"{workdir}/file", "")
    with pytest.raises(InvalidArgumentException):
        sbx.files.watch_dir(f"{workdir}/file")


def test_command_side_changes_are_seen(sbx: Sandbox, workdir: str) -> None:
    wh = sbx.files.watch_dir(workdir)
    sbx.commands.run(f"touch {workdir}/t; chmod 600 {workdir}/t; rm {workdir}/t")
    assert [e.type for e in wh.get_new_events()] == [T.CREATE, T.CHMOD, T.CHMOD, T.REMOVE]
    wh.stop()


async def test_async_watch_dir_stream(asbx: AsyncSandbox) -> None:
    w = "aw-" + uuid.uuid4().hex[:8]
    await asbx.files.make_dir(w)
    seen: list[tuple[str, FilesystemEventType]] = []
    got_write = asyncio.Event()

    def on_event(e) -> None:  # type: ignore[no-untyped-def]
        seen.append((e.name, e.type))
        if e.type == T.WRITE:
            got_write.set()

    handle = await asbx.files.watch_dir(w, on_event=on_event, recursive=True)
    await asbx.files.write(f"{w}/sub/f.txt", "hello")
    await asyncio.wait_for(got_write.wait(), 15)
    assert ("sub", T.CREATE) in seen
    assert ("sub/f.txt", T.CREATE) in seen
    await handle.stop()


async def test_async_watch_missing_dir(asbx: AsyncSandbox) -> None:
    with pytest.raises(FileNotFoundException):
        await asbx.files.watch_dir("/nope-" + uuid.uuid4().hex, on_event=lambda e: None)
