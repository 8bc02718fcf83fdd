"""files.* through the unmodified SDK (sync Sandbox): checklist items 6 to 12, plus
metadata, gzip, octet-stream, Range-free reads of binary data and path normalisation."""

from __future__ import annotations

import io
import os
from datetime import datetime

import pytest
from e2b import FileNotFoundException, FileType, InvalidArgumentException, Sandbox


def test_write_read_text_and_bytes(sbx: Sandbox, workdir: str) -> None:
    info = sbx.files.write(f"{workdir}/d/a.txt", "hello")
    assert info.path == f"/home/user/{workdir}/d/a.txt"
    assert info.name == "a.txt"
    assert info.type == FileType.FILE
    assert sbx.files.read(f"{workdir}/d/a.txt") == "hello"
    assert sbx.files.read(f"/home/user/{workdir}/d/a.txt", format="bytes") == bytearray(b"hello")
    assert b"".join(sbx.files.read(f"{workdir}/d/a.txt", format="stream")) == b"hello"
    # The command side sees the same file, owned by the user, parents included.
    r = sbx.commands.run(f"cat {workdir}/d/a.txt; stat -c '%U %a' {workdir}/d {workdir}/d/a.txt")
    assert r.stdout == "hellouser 755\nuser 644\n"


def test_overwrite_truncates(sbx: Sandbox, workdir: str) -> None:
    sbx.files.write(f"{workdir}/f", "a long first version")
    sbx.files.write(f"{workdir}/f", "short")
    assert sbx.files.read(f"{workdir}/f") == "short"


def test_binary_roundtrip_1mib(sbx: Sandbox, workdir: str) -> None:
    data = os.urandom(1024 * 1024)
    sbx.files.write(f"{workdir}/blob.bin", data)
    assert bytes(sbx.files.read(f"{workdir}/blob.bin", format="bytes")) == data


def test_write_files_and_list_sorted_absolute(sbx: Sandbox, workdir: str) -> None:
    infos = sbx.files.write_files(
        [
            {"path": f"{workdir}/b.txt", "data": "b"},
            {"path": f"/home/user/{workdir}/a.txt", "data": b"a"},
            {"path": f"{workdir}/sub/c.txt", "data": io.BytesIO(b"c")},
        ]
    )
    assert [i.path for i in infos] == [
        f"/home/user/{workdir}/b.txt",
        f"/home/user/{workdir}/a.txt",
        f"/home/user/{workdir}/sub/c.txt",
    ]
    entries = sbx.files.list(workdir)
    assert [e.name for e in entries] == ["a.txt", "b.txt", "sub"]
    assert [e.path for e in entries] == [
        f"/home/user/{workdir}/{n}" for n in ("a.txt", "b.txt", "sub")
    ]
    assert [e.type for e in entries] == [FileType.FILE, FileType.FILE, FileType.DIR]


def test_list_depth_is_lexical_depth_first(sbx: Sandbox, workdir: str) -> None:
    for p in ("b/y", "a/z/deep", "a/x", "c"):
        sbx.files.write(f"{workdir}/{p}", "")
    names = [
        e.path.removeprefix(f"/home/user/{workdir}/") for e in sbx.files.list(workdir, depth=2)
    ]
    assert names == ["a", "a/x", "a/z", "b", "b/y", "c"]
    deeper = [
        e.path.removeprefix(f"/home/user/{workdir}/") for e in sbx.files.list(workdir, depth=3)
    ]
    assert deeper == ["a", "a/x", "a/z", "a/z/deep", "b", "b/y", "c"]


def test_list_errors(sbx: Sandbox, workdir: str) -> None:
    with pytest.raises(FileNotFoundException):
        sbx.files.list(f"{workdir}/missing")
    sbx.files.write(f"{workdir}/file", "x")
    with pytest.raises(InvalidArgumentException):
        sbx.files.list(f"{workdir}/file")


def test_exists_and_get_info(sbx: Sandbox, workdir: str) -> None:
    sbx.files.write(f"{workdir}/i.txt", "12345")
    assert sbx.files.exists(f"{workdir}/i.txt") is True
    assert sbx.files.exists(f"{workdir}/nope") is False
    info = sbx.files.get_info(f"{workdir}/i.txt")
    assert (info.name, info.type, info.size, info.mode, info.permissions) == (
        "i.txt",
        FileType.FILE,
        5,
        0o644,
        "-rw-r--r--",
    )
    assert (info.owner, info.group) == ("user", "user")
    assert isinstance(info.modified_time, datetime) and info.modified_time.tzinfo is not None
    assert info.symlink_target is None
    d = sbx.files.get_info(workdir)
    assert (d.type, d.permissions) == (FileType.DIR, "drwxr-xr-x")


def test_symlink_info(sbx: Sandbox, workdir: str) -> None:
    sbx.files.write(f"{workdir}/target.txt", "t")
    sbx.commands.run(f"ln -s target.txt {workdir}/link", cwd="/home/user")
    info = sbx.files.get_info(f"{workdir}/link")
    assert info.type == FileType.FILE  # the target's type, as E2B's suite expects
    assert info.symlink_target == f"/home/user/{workdir}/target.txt"


def test_make_dir(sbx: Sandbox, workdir: str) -> None:
    assert sbx.files.make_dir(f"{workdir}/x/y/z") is True
    assert sbx.files.make_dir(f"{workdir}/x/y/z") is False
    assert sbx.files.get_info(f"{workdir}/x/y").owner == "user"
    sbx.files.write(f"{workdir}/plain", "")
    with pytest.raises(InvalidArgumentException):
        sbx.files.make_dir(f"{workdir}/plain")


def test_rename(sbx: Sandbox, workdir: str) -> None:
    sbx.files.write(f"{workdir}/old.txt", "data")
    info = sbx.files.rename(f"{workdir}/old.txt", f"{workdir}/new/dir/new.txt")
    assert info.path == f"/home/user/{workdir}/new/dir/new.txt"
    assert sbx.files.exists(f"{workdir}/old.txt") is False
    assert sbx.files.read(f"{workdir}/new/dir/new.txt") == "data"
    with pytest.raises(FileNotFoundException):
        sbx.files.rename(f"{workdir}/missing", f"{workdir}/whatever")


def test_remove(sbx: Sandbox, workdir: str) -> None:
    sbx.files.write(f"{workdir}/tree/a/b.txt", "x")
    sbx.files.remove(f"{workdir}/tree")
    assert sbx.files.exists(f"{workdir}/tree") is False
    sbx.files.remove(f"{workdir}/tree")  # missing is fine


def test_read_errors(sbx: Sandbox, workdir: str) -> None:
    with pytest.raises(FileNotFoundException):
        sbx.files.read(f"{workdir}/missing")
    with pytest.raises(InvalidArgumentException):
        sbx.files.read(workdir)


def test_dotdot_paths_are_normalised(sbx: Sandbox, workdir: str) -> None:
    info = sbx.files.write(f"{workdir}/x/../y.txt", "y")
    assert info.path == f"/home/user/{workdir}/y.txt"
    assert sbx.files.read(f"/home/user/{workdir}/../{workdir}/./y.txt") == "y"
    assert sbx.files.exists("/../../etc/passwd") is True


def test_user_and_home_expansion(sbx: Sandbox, workdir: str) -> None:
    info = sbx.files.write("~/" + workdir + "/tilde.txt", "t")
    assert info.path == f"/home/user/{workdir}/tilde.txt"
    root_info = sbx.files.write("from-root.txt", "r", user="root")
    assert root_info.path == "/root/from-root.txt"
    assert sbx.files.get_info("/root/from-root.txt", user="root").owner == "root"


def test_metadata(sbx: Sandbox, workdir: str) -> None:
    info = sbx.files.write(f"{workdir}/m.txt", "m", metadata={"Author": "me", "k2": "v 2"})
    assert info.metadata == {"author": "me", "k2": "v 2"}
    assert sbx.files.get_info(f"{workdir}/m.txt").metadata == {"author": "me", "k2": "v 2"}
    # Overwriting replaces the metadata set.
    sbx.files.write(f"{workdir}/m.txt", "m2", metadata={"only": "this"})
    assert sbx.files.get_info(f"{workdir}/m.txt").metadata == {"only": "this"}
    listed = {e.name: e.metadata for e in sbx.files.list(workdir)}
    assert listed["m.txt"] == {"only": "this"}


def test_gzip_and_octet_stream(sbx: Sandbox, workdir: str) -> None:
    data = b"compress me " * 10000
    sbx.files.write(f"{workdir}/gz.txt", data, gzip=True)
    assert bytes(sbx.files.read(f"{workdir}/gz.txt", format="bytes", gzip=True)) == data
    sbx.files.write(f"{workdir}/oct.bin", iter([b"part1-", b"part2"]))
    assert sbx.files.read(f"{workdir}/oct.bin") == "part1-part2"
    sbx.files.write(f"{workdir}/oct2.bin", b"forced", use_octet_stream=True)
    assert sbx.files.read(f"{workdir}/oct2.bin") == "forced"


def test_upload_into_a_directory_path_is_invalid(sbx: Sandbox, workdir: str) -> None:
    sbx.files.make_dir(f"{workdir}/isdir")
    with pytest.raises(InvalidArgumentException):
        sbx.files.write(f"{workdir}/isdir", "x")
