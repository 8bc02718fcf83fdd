"""Making an unpacked image fit for a sandbox, without ever writing outside the tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aenv.images.rootfs import (
    TOOLS_BUSYBOX,
    UnsafePath,
    ensure_shell,
    ensure_user,
    prepare,
    resolve_in_root,
    user_name,
)


def test_symlinks_resolve_inside_the_tree(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "bin").symlink_to("/usr/bin")  # absolute: the guest's /usr/bin, not the host's
    (root / "etc").symlink_to("../../../../../real")  # climbs past the root: stops at it
    (root / "loop").symlink_to("loop")
    (root / "tmp").symlink_to("../../tmp")  # is itself again: a loop, as in a chroot
    assert resolve_in_root(root, "/bin/bash") == root / "usr/bin/bash"
    assert resolve_in_root(root, "/etc/passwd") == root / "real/passwd"
    assert resolve_in_root(root, "/../../x") == root / "x"
    with pytest.raises(UnsafePath):
        resolve_in_root(root, "/loop/x")
    with pytest.raises(UnsafePath):
        resolve_in_root(root, "/tmp/x")


def test_the_host_is_never_written_through_an_absolute_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "etc").symlink_to(outside)  # absolute host path: inside the guest it is /<path>
    acct = ensure_user(root)
    assert acct.uid == 1000 and acct.added
    assert list(outside.iterdir()) == []
    assert "user:x:1000:1000::/home/user:/bin/bash" in resolve_in_root(
        root, "/etc/passwd").read_text()


def test_user_gets_the_next_free_uid_when_1000_is_taken(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\nnode:x:1000:1000::/home/"
                                         "node:/bin/sh\nweb:x:1001:1001::/:/bin/sh")  # fmt: skip
    (tmp_path / "etc/group").write_text("root:x:0:\nnode:x:1000:\nweb:x:1001:\n")
    acct = ensure_user(tmp_path)
    assert (acct.uid, acct.added) == (1002, True)
    assert "\nuser:x:1002:1002:" in (tmp_path / "etc/passwd").read_text()
    assert (tmp_path / "home/user").stat().st_uid == 1002
    assert ensure_user(tmp_path) == type(acct)("user", 1002, False)  # idempotent
    assert user_name(tmp_path, "1001:1001") == "web"
    assert user_name(tmp_path, "node") == "node"
    assert user_name(tmp_path, None) is None


def test_a_tree_without_a_shell_gets_the_tools_busybox(tmp_path: Path) -> None:
    ensure_shell(tmp_path)
    assert os.readlink(tmp_path / "bin/sh") == TOOLS_BUSYBOX
    assert (tmp_path / "bin/bash").read_text().startswith("#!/bin/sh\n")
    assert (tmp_path / "tmp").stat().st_mode & 0o7777 == 0o1777


def test_an_image_shell_is_kept(tmp_path: Path) -> None:
    (tmp_path / "usr/bin").mkdir(parents=True)
    (tmp_path / "bin").symlink_to("usr/bin")
    (tmp_path / "usr/bin/bash").write_text("real bash")
    (tmp_path / "usr/bin/sh").symlink_to("bash")
    prepare(tmp_path)
    assert (tmp_path / "usr/bin/bash").read_text() == "real bash"
    assert os.readlink(tmp_path / "usr/bin/sh") == "bash"
