"""Build requests as the SDK sends them: validation, the step cache's key chain, the
upload signature, archive checks, and the COPY script (run here with the host's busybox on
a scratch directory, as the build VM runs it)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from aenv.images.context import ContextError, ContextStore, check_archive
from aenv.images.copying import copy_script, source_base
from aenv.images.steps import BuildSpec, Step, StepError, chain, resolve

BUSYBOX = "/bin/busybox"
H = "ab" * 32


def test_unknown_step_types_and_bad_args_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown step type 'ADD'"):
        BuildSpec.model_validate({"fromImage": "x", "steps": [{"type": "ADD", "args": []}]})
    for body, msg in [
        ({"steps": []}, "fromImage or fromTemplate"),
        ({"fromImage": "a", "fromTemplate": "b"}, "exclude"),
        ({"fromImage": "a", "fromImageRegistry": {"type": "aws"}}, "not supported"),
        ({"fromImage": "a", "steps": [{"type": "ENV", "args": ["K"]}]}, "pairs"),
        ({"fromImage": "a", "steps": [{"type": "COPY", "args": ["a", "/b", "", ""]}]},
         "filesHash"),
        ({"fromImage": "a", "steps": [{"type": "COPY", "args": ["../x", "/b", "", ""],
                                       "filesHash": H}]}, "leaves the build context"),
        ({"fromImage": "a", "steps": [{"type": "COPY", "args": ["x", "/b", "", "0789"],
                                       "filesHash": H}]}, "not octal"),
        ({"fromImage": "a", "steps": [{"type": "RUN", "args": []}]}, "expected 1 to 2"),
    ]:  # fmt: skip
        with pytest.raises(StepError, match=msg):
            BuildSpec.model_validate(body).check()


def test_the_cache_key_chains_every_step_before() -> None:
    run = Step(type="RUN", args=["echo 1"])
    other = Step(type="RUN", args=["echo 2"])
    k1 = chain("base", run)
    assert chain("base", run) == k1 and len(k1) == 64
    assert chain(k1, other) != chain(chain("base", other), other)
    assert chain("base", Step(type="RUN", args=["echo 1"], force=True)) == k1  # force: no key
    copy = Step(type="COPY", args=["a", "/b", "", ""], filesHash=H)
    assert chain("base", copy) != chain("base", copy.model_copy(update={"filesHash": "c" * 64}))


def test_paths_resolve_against_the_workdir() -> None:
    assert resolve("app", "/home/user") == "/home/user/app"
    assert resolve("/abs/", "/home/user") == "/abs/"
    assert resolve("../x", "/home/user") == "/home/x"


def test_upload_urls_are_signed_and_expire(tmp_path: Path) -> None:
    store = ContextStore(tmp_path, 1 << 20)
    path = store.upload_path(H)
    q = dict(p.split("=") for p in path.split("?", 1)[1].split("&"))
    assert store.verify(H, q["exp"], q["sig"])
    assert not store.verify("cd" * 32, q["exp"], q["sig"])
    assert not store.verify(H, str(int(q["exp"]) + 1), q["sig"])
    assert not store.verify(H, str(int(time.time()) - 1), store._mac(H, int(time.time()) - 1))
    assert not ContextStore(tmp_path, 1 << 20).verify(H, q["exp"], q["sig"])  # another node
    with pytest.raises(ContextError):
        store.path("../../etc")


def _tar(tmp_path: Path, members: list[tarfile.TarInfo], gz: bool = True) -> Path:
    p = tmp_path / "ctx.tar.gz"
    with tarfile.open(p, "w:gz" if gz else "w") as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(b"x" * m.size) if m.isfile() else None)
    return p


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    m = tarfile.TarInfo(name)
    m.type, m.linkname, m.size = kind, link, 1 if kind == tarfile.REGTYPE else 0
    return m


@pytest.mark.parametrize(("members", "why"), [
    ([_member("/etc/passwd")], "leaves"),
    ([_member("../x")], "leaves"),
    ([_member("a/../../x")], "leaves"),
    ([_member("d", tarfile.SYMTYPE, "/etc"), _member("d/passwd")], "through the symlink"),
    ([_member("h", tarfile.LNKTYPE, "/etc/shadow")], "names no earlier member"),
    ([_member("dev", tarfile.CHRTYPE)], "device"),
])  # fmt: skip
def test_archives_that_escape_are_refused(tmp_path: Path, members: list[tarfile.TarInfo],
                                          why: str) -> None:
    with pytest.raises(ContextError, match=why):
        check_archive(_tar(tmp_path, members))


def test_links_anywhere_are_fine_as_links(tmp_path: Path) -> None:
    check_archive(_tar(tmp_path, [_member("abs", tarfile.SYMTYPE, "/etc/passwd"),
                                  _member("dangling", tarfile.SYMTYPE, "nowhere"),
                                  _member("f"), _member("h", tarfile.LNKTYPE, "f")], gz=False))
    with pytest.raises(ContextError, match="not a readable tar"):
        (tmp_path / "junk").write_bytes(b"\x1f\x8bnot really")
        check_archive(tmp_path / "junk")


def test_glob_bases() -> None:
    assert source_base("folder/*") == "folder"
    assert source_base("a/**/b.txt") == "a"
    assert source_base("a.txt") == "a.txt"
    assert source_base("*") == "."
    assert source_base("./d/") == "d"


@pytest.mark.skipif(not Path(BUSYBOX).exists() or os.geteuid() != 0,
                    reason="needs busybox-static and root (chown)")
@pytest.mark.parametrize(("src", "dest", "want"), [
    ("app", "/out/app", {"out/app/a.txt", "out/app/sub/b.txt", "out/app/link"}),
    ("app/*", "/out/x", {"out/x/a.txt", "out/x/sub/b.txt", "out/x/link"}),
    ("app/a.txt", "/out/renamed.txt", {"out/renamed.txt"}),
    ("app/a.txt", "/out/dir/", {"out/dir/a.txt"}),
])  # fmt: skip
def test_the_copy_script(tmp_path: Path, src: str, dest: str, want: set[str]) -> None:
    ctx = tmp_path / "ctx"
    (ctx / "app/sub").mkdir(parents=True)
    (ctx / "app/a.txt").write_text("A")
    (ctx / "app/sub/b.txt").write_text("B")
    (ctx / "app/link").symlink_to("/etc/passwd")  # absolute: copied as a link, never followed
    archive = tmp_path / "in.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(ctx / "app", arcname="app")
    root = tmp_path / "root"
    (root / "tmp").mkdir(parents=True)
    before = os.stat("/etc/passwd")
    script = copy_script(str(archive), False, source_base(src), str(root) + dest,
                         "1234:1234", "0700", busybox=BUSYBOX)  # fmt: skip
    p = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True,
                       env={"TMPDIR": str(root / "tmp"), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert p.returncode == 0, p.stderr
    got = {str(q.relative_to(root)) for q in root.rglob("*")
           if q.is_file() or q.is_symlink()}  # fmt: skip
    assert got == want
    for rel in want:  # what was copied (not the directories made to hold it)
        q = root / rel
        assert q.lstat().st_uid == 1234
        if not q.is_symlink():
            assert q.stat().st_mode & 0o777 == 0o700
    assert os.stat("/etc/passwd") == before  # chmod/chown never went through the link
    assert not archive.exists()


def test_a_restart_marks_unfinished_builds_failed(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from aenv.config import Config
    from aenv.images.builds import Builds
    from aenv.storage.snapshots import SnapshotStore
    from aenv.storage.templates import TemplateCatalog

    cfg = Config.model_validate({"data_dir": tmp_path, "runtime": "fake"})
    contexts = ContextStore(tmp_path / "ctx", 1 << 20)
    rt = SimpleNamespace(snapshots=SnapshotStore(tmp_path / "snapshots"),
                         catalog=TemplateCatalog(tmp_path / "templates"))  # fmt: skip
    first = Builds(cfg, rt, contexts)
    running = first.request("t1", ["t1"], ["default"], cfg.default_shape)
    running.status = "building"
    first._save(running)
    done = first.request("t2", ["t2"], ["default"], cfg.default_shape)
    done.status = "ready"
    first._save(done)
    again = Builds(cfg, rt, contexts)  # the node started again
    b = again.get("t1", running.build_id)
    assert b.status == "error" and b.reason == {
        "message": "the node restarted during the build", "step": "base"}
    assert again.get("t2", done.build_id).status == "ready"
    with pytest.raises(LookupError):
        again.get("t2", running.build_id)  # another template's build
