"""inotify-backed watchers: the upload triple, renames, recursion, draining."""

from __future__ import annotations

import os
from pathlib import Path

from aenv.guest.agent.files_http import _Upload
from aenv.guest.agent.users import User
from aenv.guest.agent.watchers import Watcher, is_network_fs, mount_fstype
from aenv.guest.gen.filesystem_pb import EventType as T

ME = User("me", os.getuid(), os.getgid(), "/", (os.getgid(),))


def _events(w: Watcher) -> list[tuple[str, T]]:
    return [(e.name, e.type) for e in w.take()]


def test_new_upload_is_create_chmod_write(tmp_path: Path) -> None:
    w = Watcher(str(tmp_path), recursive=False, include_entry=True)
    try:
        with _Upload(str(tmp_path / "f.txt"), ME, {"k": "v"}) as up:
            up.write(b"x" * 100)
            up.write(b"y" * 100)
        events = w.take()
        assert [(e.name, e.type) for e in events] == [
            ("f.txt", T.CREATE), ("f.txt", T.CHMOD), ("f.txt", T.WRITE)
        ]  # fmt: skip
        assert events[2].entry is not None and events[2].entry.size == 200
        os.rename(tmp_path / "f.txt", tmp_path / "g.txt")
        os.unlink(tmp_path / "g.txt")
        assert _events(w) == [("f.txt", T.RENAME), ("g.txt", T.CREATE), ("g.txt", T.REMOVE)]
    finally:
        w.close()


def test_recursive_watch_follows_new_directories(tmp_path: Path) -> None:
    w = Watcher(str(tmp_path), recursive=True, include_entry=False)
    try:
        (tmp_path / "a" / "b").mkdir(parents=True)
        (tmp_path / "a" / "b" / "f").write_text("data")
        events = _events(w)
        assert events[0] == ("a", T.CREATE)
        assert ("a/b", T.CREATE) in events
        assert ("a/b/f", T.CREATE) in events and ("a/b/f", T.WRITE) in events
        (tmp_path / "a" / "b" / "g").write_text("")
        assert _events(w) == [("a/b/g", T.CREATE)]
    finally:
        w.close()


def test_watched_directory_removal_ends_the_watch(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    w = Watcher(str(d), recursive=False, include_entry=False)
    try:
        d.rmdir()
        w.take()
        assert w.ended
    finally:
        w.close()


def test_network_filesystems() -> None:
    assert is_network_fs("nfs4") and is_network_fs("fuse.sshfs") and is_network_fs("cifs")
    assert not is_network_fs("ext4") and not is_network_fs("tmpfs") and not is_network_fs(None)
    assert mount_fstype("/") is not None
