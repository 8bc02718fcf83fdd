"""A layer applied in place (`images.apply_layer`, the code build VMs run) on a scratch root:
whiteouts, opaque directories, replacements, owners, setuid, xattrs, links and devices."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from aenv.images.apply_layer import LayerError, apply

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="owners and device nodes need root")


def _layer(path: Path, entries: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]]) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            info, data = e if isinstance(e, tuple) else (e, b"")
            tf.addfile(info, io.BytesIO(data) if data else None)
    return path


def _file(name: str, data: bytes, mode: int = 0o644, uid: int = 0,
          xattrs: dict[str, str] | None = None) -> tuple[tarfile.TarInfo, bytes]:
    t = tarfile.TarInfo(name)
    t.size, t.mode, t.uid, t.gid = len(data), mode, uid, uid
    t.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in (xattrs or {}).items()}
    return t, data


def _entry(name: str, kind: bytes, **kw: object) -> tarfile.TarInfo:
    t = tarfile.TarInfo(name)
    t.type = kind
    for k, v in kw.items():
        setattr(t, k, v)
    return t


def test_a_layer_lands_as_an_overlay_would_show_it(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for d in ("etc", "opq/old", "srv", "swap"):
        (root / d).mkdir(parents=True)
    (root / "etc/gone").write_text("lower")
    (root / "etc/kept").write_text("lower")
    (root / "opq/old/f").write_text("lower")
    (root / "opq/top").write_text("lower")
    (root / "srv/link").symlink_to("/etc/kept")
    (root / "swap/was-file").write_text("lower")

    layer = _layer(tmp_path / "l.tar.gz", [
        _entry("./etc/.wh.gone", tarfile.REGTYPE),
        _entry("opq", tarfile.DIRTYPE, mode=0o750, uid=7, gid=7),
        _entry("opq/.wh..wh..opq", tarfile.REGTYPE),
        _file("opq/new", b"upper"),
        _file("srv/a", b"linked", uid=123),
        _entry("srv/b", tarfile.LNKTYPE, linkname="srv/a"),
        _file("srv/suid", b"#!/bin/sh\n", mode=0o4755),
        _file("srv/x", b"x", xattrs={"user.aenv": "ok"}),
        _file("srv/link", b"a file now"),  # replaces the symlink, not its target
        _entry("swap/was-file", tarfile.DIRTYPE, mode=0o755),
        _entry("dev/null", tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666),
        _entry("srv/rel", tarfile.SYMTYPE, linkname="../etc/kept"),
    ])  # fmt: skip
    assert apply(layer, root) == 10

    assert not (root / "etc/gone").exists() and (root / "etc/kept").read_text() == "lower"
    assert sorted(p.name for p in (root / "opq").iterdir()) == ["new"]
    st = (root / "opq").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o750, 7)
    a, b = (root / "srv/a").stat(), (root / "srv/b").stat()
    assert (a.st_ino, a.st_nlink, a.st_uid) == (b.st_ino, 2, 123)
    assert stat.S_IMODE((root / "srv/suid").stat().st_mode) == 0o4755
    assert os.getxattr(root / "srv/x", "user.aenv") == b"ok"
    assert not (root / "srv/link").is_symlink() and (root / "srv/link").read_text() == "a file now"
    assert (root / "etc/kept").read_text() == "lower"
    assert (root / "swap/was-file").is_dir()
    assert os.major((root / "dev/null").stat().st_rdev) == 1
    assert os.readlink(root / "srv/rel") == "../etc/kept"


def test_a_path_that_leaves_the_root_is_refused(tmp_path: Path) -> None:
    layer = _layer(tmp_path / "bad.tar.gz", [_file("../outside", b"no")])
    with pytest.raises(LayerError, match="leaves the root"):
        apply(layer, tmp_path / "root")
    assert not (tmp_path / "outside").exists()


def test_a_layer_without_its_end_blocks_is_whole_but_a_cut_one_is_not(tmp_path: Path) -> None:
    """umoci's `insert` (Go's tar writer left unclosed) ends a layer right after the last
    file's bytes: Docker and umoci take it, so must we; a layer cut inside a file is refused."""
    import gzip

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info, data = _file("opt/new", b"new")
        tf.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    unpadded = tmp_path / "unpadded.tar.gz"
    unpadded.write_bytes(gzip.compress(raw[:512 + 3]))
    assert apply(unpadded, tmp_path / "a") == 1
    assert (tmp_path / "a/opt/new").read_bytes() == b"new"
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(gzip.compress(raw[:512 + 2]))
    with pytest.raises(tarfile.ReadError):
        apply(cut, tmp_path / "b")
