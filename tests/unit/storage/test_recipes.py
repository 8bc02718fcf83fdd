"""The recipe registry and the code interpreter tree's parts (the tree itself is built and
booted by tests/e2e/test_interpreter.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from aenv.storage import interpreter_tree, wheels
from aenv.storage.recipes import RECIPES


def test_the_add_on_recipes_start_their_server_and_say_when_it_is_ready() -> None:
    for name in ("code-interpreter-v1", "code-interpreter-minimal"):
        r = RECIPES[name]
        assert r.start_cmd == interpreter_tree.START and r.start_user == "root"
        assert r.ready_cmd is not None and "49999/health" in r.ready_cmd
    assert RECIPES["code-interpreter-v1"].shape is not None
    assert RECIPES["code-interpreter-v1"].shape.memory_mib == 2048
    assert all(RECIPES[n].start_cmd is None for n in ("debian", "familiar", "busybox"))
    desktop = RECIPES["desktop"]
    assert desktop.start_user == "user" and desktop.ready_cmd is not None
    assert "xfce4-session" in desktop.ready_cmd


def test_the_interpreters_version_follows_its_sources(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    server = tmp_path / "interpreter"
    shutil.copytree(interpreter_tree.SERVER, server,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    monkeypatch.setattr(interpreter_tree, "SERVER", server)
    monkeypatch.setattr(interpreter_tree, "REQUIREMENTS", server / "requirements")
    before = interpreter_tree.version()
    assert before == interpreter_tree.version()
    (server / "app.py").write_text((server / "app.py").read_text() + "\n# changed\n")
    changed = interpreter_tree.version()
    assert changed != before
    (server / "requirements" / "python.txt").write_text("changed==1\n")
    assert interpreter_tree.version() != changed


def test_the_supervisor_script_is_valid_sh_for_both_kinds() -> None:
    for languages, preload in (("python", ""), ("python,javascript", interpreter_tree.PRELOAD)):
        script = interpreter_tree.SUPERVISE.format(port=49999, languages=languages,
                                                   preload=preload)  # fmt: skip
        assert subprocess.run(["sh", "-n"], input=script, text=True).returncode == 0
        assert f"--languages {languages}" in script


def test_every_requirement_is_pinned_with_hashes() -> None:
    for f in interpreter_tree.REQUIREMENTS.glob("*.txt"):
        names = [line.split("==")[0] for line in f.read_text().splitlines()
                 if line and not line[0].isspace() and not line.startswith("#")]  # fmt: skip
        text = f.read_text()
        assert names and text.count("==") == len(names), f
        assert text.count("--hash=sha256:") >= len(names), f


def test_a_bad_requirements_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("not-a-package-aenv-x==0.0.0 --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(wheels.WheelsError, match="bad.txt failed"):
        wheels.install(tmp_path / "root", bad, tmp_path / "log")
