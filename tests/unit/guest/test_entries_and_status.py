"""EntryInfo details, ListDir order, Go mode strings, exit statuses, inotify records."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import pytest

from aenv.guest.agent.entries import entry_info, go_mode_string, walk
from aenv.guest.agent.inotify import IN_CREATE, IN_ISDIR, parse_events
from aenv.guest.agent.processes import ExitInfo
from aenv.guest.gen.filesystem_pb import FileType


@pytest.mark.parametrize(
    ("mode", "text"),
    [
        (stat.S_IFREG | 0o644, "-rw-r--r--"),
        (stat.S_IFDIR | 0o755, "drwxr-xr-x"),
        (stat.S_IFDIR | 0o1777, "dtrwxrwxrwx"),
        (stat.S_IFLNK | 0o777, "Lrwxrwxrwx"),
        (stat.S_IFREG | 0o4755, "urwxr-xr-x"),
        (stat.S_IFREG | 0o2755, "grwxr-xr-x"),
        (stat.S_IFCHR | 0o666, "Dcrw-rw-rw-"),
        (stat.S_IFBLK | 0o660, "Drw-rw----"),
        (stat.S_IFIFO | 0o600, "prw-------"),
        (stat.S_IFSOCK | 0o777, "Srwxrwxrwx"),
    ],
)
def test_go_mode_string(mode: int, text: str) -> None:
    assert go_mode_string(mode) == text


def test_walk_is_lexical_depth_first_preorder(tmp_path: Path) -> None:
    for p in ("b/y", "a/z/deep/x", "a/x", "c", "B"):
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).write_text("")
    rel = [e.path.removeprefix(str(tmp_path) + "/") for e in walk(str(tmp_path), 2)]
    assert rel == ["B", "a", "a/x", "a/z", "b", "b/y", "c"]
    rel1 = [e.path.removeprefix(str(tmp_path) + "/") for e in walk(str(tmp_path), 1)]
    assert rel1 == ["B", "a", "b", "c"]


def test_walk_lists_but_does_not_enter_symlinked_dirs(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    entries = list(walk(str(tmp_path), 3))
    names = [e.name for e in entries]
    assert names == ["link", "real", "f"]
    link = entries[0]
    assert not link.is_symlink and link.type == FileType.DIRECTORY  # envd 0.6's answer
    assert link.symlink_target == str(tmp_path / "real")


def test_entry_info_fields(tmp_path: Path) -> None:
    f = tmp_path / "file.txt"
    f.write_bytes(b"12345")
    f.chmod(0o640)
    os.setxattr(f, "user.e2b.k", b"v")
    os.setxattr(f, "user.other", b"ignored")
    e = entry_info(str(f))
    assert (e.name, e.type, e.size, e.mode, e.permissions) == (
        "file.txt", FileType.FILE, 5, 0o640, "-rw-r-----"
    )  # fmt: skip
    assert e.metadata == {"k": "v"}
    assert e.modified_time.seconds == int(f.stat().st_mtime)
    assert not e.has_field("symlink_target")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    d = entry_info(str(dangling))
    assert d.type == FileType.SYMLINK and d.symlink_target == str(tmp_path / "nowhere")


def test_exit_info_matches_go_process_state() -> None:
    assert ExitInfo.from_wait_status(0) == ExitInfo(0, True, "exit status 0", None)
    assert ExitInfo.from_wait_status(3 << 8) == ExitInfo(3, True, "exit status 3", "exit status 3")
    assert ExitInfo.from_wait_status(9) == ExitInfo(-1, False, "signal: killed", "signal: killed")
    assert ExitInfo.from_wait_status(15).status == "signal: terminated"
    assert ExitInfo.from_wait_status(11 | 0x80).status == "signal: segmentation fault (core dumped)"


def test_parse_inotify_records() -> None:
    name = b"file.txt\0\0\0\0\0\0\0\0"
    buf = struct.pack("iIII", 1, IN_CREATE, 0, len(name)) + name
    buf += struct.pack("iIII", 2, IN_CREATE | IN_ISDIR, 7, 0)
    events = list(parse_events(buf))
    assert [(e.wd, e.mask, e.cookie, e.name) for e in events] == [
        (1, IN_CREATE, 0, "file.txt"), (2, IN_CREATE | IN_ISDIR, 7, "")
    ]  # fmt: skip
