"""The CLI against a node with the fake runtime (no VMs): listings, ids, errors, completion,
auth, and the pause/resume/fork/snapshot commands."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from .conftest import (
    AENV,
    ANSI,
    API_KEY,
    Node,
    assert_one_line_error,
    cli_env,
    free_port,
    run_cli,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def two(fake_node: Node) -> Iterator[list[str]]:
    """Two running sandboxes, the first started by `aenv start -d`."""
    p = fake_node.cli("start", "-d", "base", "--timeout", "300", "--metadata", "t=cli")
    assert p.returncode == 0 and ANSI not in p.stdout + p.stderr, p.stderr
    ids = [p.stdout.strip()]
    with fake_node.api() as c:
        body = {"templateID": "base", "timeout": 300, "metadata": {"t": "cli"}}
        ids.append(c.post("/v2/sandboxes", json=body).json()["sandboxID"])
    yield ids
    with fake_node.api() as c:
        for sid in ids:
            c.delete(f"/sandboxes/{sid}")


# --- listings ---------------------------------------------------------------------------------


def test_ls_json_when_piped_and_table_on_request(fake_node: Node, two: list[str]) -> None:
    p = fake_node.cli("ls")
    assert p.returncode == 0, p.stderr
    items = json.loads(p.stdout)
    listed = {s["sandboxID"]: s for s in items}
    for sid in two:
        assert listed[sid]["state"] == "running"
        assert listed[sid]["metadata"] == {"t": "cli"}
    assert [s["sandboxID"] for s in items][:2] == two[::-1]  # newest first

    assert json.loads(fake_node.cli("ls", "--state", "paused").stdout) == []
    assert set(two) <= set(fake_node.cli("ls", "-q").stdout.split())

    table = fake_node.cli("ls", "--table")
    assert table.returncode == 0 and ANSI not in table.stdout + table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[:3] == ["ID", "TEMPLATE", "STATE"]
    assert {r.split()[0] for r in rows} >= set(two)

    p = fake_node.cli("template", "ls")
    assert "base" in {t["templateID"] for t in json.loads(p.stdout)}


def test_table_on_a_terminal_without_colour_for_no_color(fake_node: Node, two: list[str]) -> None:
    child = pexpect.spawn(AENV, ["ls"], env={**fake_node.cli_env, "NO_COLOR": "1"},
                          dimensions=(24, 200), timeout=30)  # fmt: skip
    child.expect(pexpect.EOF)
    text = child.before.decode()
    child.close()
    assert child.exitstatus == 0
    assert two[0] in text and "TEMPLATE" in text  # a table, not JSON, on a terminal
    for colour in ("\x1b[3", "\x1b[9", "\x1b[38"):
        assert colour not in text


# --- ids, prefixes, errors --------------------------------------------------------------------


def test_unique_prefix_works_and_ambiguous_prefix_is_an_error(fake_node: Node) -> None:
    # 37 ids over a 36-character alphabet: two of them must share their first character.
    with fake_node.api() as c:
        ids = [c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 300}
                      ).json()["sandboxID"] for _ in range(37)]  # fmt: skip
    try:
        firsts = [i[0] for i in ids]
        shared = next(ch for ch in firsts if firsts.count(ch) > 1)
        p = fake_node.cli("timeout", shared, "60")
        assert_one_line_error(p, f"ambiguous sandbox id prefix '{shared}'")

        # Unique among every sandbox on the node, not only this test's: the node is shared.
        everyone = fake_node.sandbox_ids()
        target = ids[0]
        prefix = next(target[:n] for n in range(1, 21)
                      if sum(i.startswith(target[:n]) for i in everyone) == 1)  # fmt: skip
        p = fake_node.cli("rm", prefix)
        assert (p.returncode, p.stdout) == (0, target + "\n"), p.stderr
        assert target not in fake_node.sandbox_ids()
    finally:
        with fake_node.api() as c:
            for sid in ids:
                c.delete(f"/sandboxes/{sid}")


def test_errors_are_one_line(fake_node: Node, tmp_path: Path) -> None:
    p = fake_node.cli("ls", env={"AENV_API_KEY": "wrong"})
    assert_one_line_error(p, "rejected the API key", "aenv auth")

    down = f"http://127.0.0.1:{free_port()}"
    p = fake_node.cli("ls", env={"AENV_URL": down})
    assert_one_line_error(p, f"cannot reach the node at {down}", "aenv server")

    for args in (["exec", "no-such-id", "--", "true"], ["rm", "no-such-id"],
                 ["upload", "no-such-id", str(tmp_path), "/tmp"]):  # fmt: skip
        assert_one_line_error(fake_node.cli(*args), "no such sandbox: no-such-id")

    assert_one_line_error(fake_node.cli("start", "-d", "no-such-template"), "template")
    p = fake_node.cli("ls", "--bogus")
    assert_one_line_error(p, "--bogus")
    assert p.returncode == 2
    assert_one_line_error(fake_node.cli("timeout", "x", "soon"), "duration")
    # Several ids: one line per failure, the rest still done.
    p = fake_node.cli("rm", "no-such-1", "no-such-2")
    assert p.returncode == 1 and len(p.stderr.splitlines()) == 2


def test_interactive_commands_need_a_terminal(fake_node: Node) -> None:
    assert_one_line_error(fake_node.cli("start", "base"), "needs a terminal", "-d")
    assert_one_line_error(fake_node.cli("cn", "whatever"), "needs a terminal")


def test_timeout_sets_the_end(fake_node: Node, two: list[str]) -> None:
    p = fake_node.cli("timeout", two[0], "2h")
    assert p.returncode == 0, p.stderr
    with fake_node.api() as c:
        end = c.get(f"/sandboxes/{two[0]}").json()["endAt"]
    from datetime import UTC, datetime

    left = datetime.fromisoformat(end.replace("Z", "+00:00")) - datetime.now(UTC)
    assert 7000 < left.total_seconds() <= 7200


# --- pause, resume, fork, snapshots (E2B shapes) ---------------------------------------------


def test_pause_exec_resume(fake_node: Node, two: list[str]) -> None:
    sid = two[0]
    p = fake_node.cli("pause", sid[:8])
    assert (p.returncode, p.stdout.strip()) == (0, sid), p.stderr
    paused = json.loads(fake_node.cli("ls", "--state", "paused").stdout)
    assert sid in [s["sandboxID"] for s in paused]
    assert [s["pauseTier"] for s in paused if s["sandboxID"] == sid] == ["cold"]
    row = [ln for ln in fake_node.cli("ls", "--table").stdout.splitlines() if sid in ln]
    assert len(row) == 1 and "paused (cold)" in row[0], row  # the fake runtime has no hot tier
    assert fake_node.cli("pause", sid).returncode == 0  # already paused: fine

    p = fake_node.cli("exec", sid, "--", "true")
    assert_one_line_error(p, "paused", f"aenv resume {sid}")

    p = fake_node.cli("resume", sid)
    assert (p.returncode, p.stdout.strip()) == (0, sid), p.stderr
    assert fake_node.cli("ls", "--state", "running", "-q").stdout.split().count(sid) == 1


def test_fork_prints_children(fake_node: Node, two: list[str]) -> None:
    p = fake_node.cli("fork", two[0], "--count", "2")
    assert p.returncode == 0, p.stderr
    children = p.stdout.split()
    try:
        assert len(children) == 2 and two[0] not in children
        assert set(children) <= set(fake_node.sandbox_ids())
    finally:
        assert fake_node.cli("rm", *children).returncode == 0


def test_snapshot_create_ls_rm(fake_node: Node, two: list[str]) -> None:
    p = fake_node.cli("snapshot", "create", two[0], "--name", "cli-snap")
    assert p.returncode == 0, p.stderr
    snap = p.stdout.strip()
    p = fake_node.cli("snapshot", "ls")
    assert snap in [s["snapshotID"] for s in json.loads(p.stdout)]
    table = fake_node.cli("snapshot", "ls", "--table").stdout.splitlines()
    assert table[0].split()[:2] == ["SNAPSHOT", "NAMES"]
    assert [snap, "cli-snap"] in [r.split()[:2] for r in table[1:]]
    p = fake_node.cli("start", "-d", snap)
    assert p.returncode == 0, p.stderr
    assert fake_node.cli("rm", p.stdout.strip()).returncode == 0
    p = fake_node.cli("snapshot", "rm", snap)
    assert (p.returncode, p.stdout.strip()) == (0, snap), p.stderr


# --- shell completion -------------------------------------------------------------------------


def test_completion_scripts(fake_node: Node) -> None:
    for shell, marker in (("bash", "complete -o default -F"), ("zsh", "compdef"),
                          ("fish", "complete --command aenv")):  # fmt: skip
        p = fake_node.cli("completion", shell)
        assert p.returncode == 0, p.stderr
        assert "_AENV_COMPLETE" in p.stdout and marker in p.stdout, p.stdout


def test_installed_bash_completion_completes_a_real_id(fake_node: Node, two: list[str]) -> None:
    p = fake_node.cli("completion", "bash", "--install")
    assert p.returncode == 0, p.stderr
    script = fake_node.home / ".bash_completions" / "aenv.sh"
    assert script.exists() and str(script) in (fake_node.home / ".bashrc").read_text()
    sid = two[0]
    line = (f"source {script}; COMP_WORDS=(aenv exec {sid[:3]}); COMP_CWORD=2; "
            '_aenv_completion aenv; printf "%s\\n" "${COMPREPLY[@]}"')  # fmt: skip
    env = {**fake_node.cli_env, "PATH": f"{Path(AENV).parent}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", "--norc", "-c", line], env=env, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert sid in out.stdout.split(), (out.stdout, out.stderr)


def test_completion_protocols(fake_node: Node, two: list[str]) -> None:
    sid = two[1]

    def complete(**env: str) -> str:
        p = fake_node.cli(env=env)
        assert p.returncode == 0 and p.stderr == "", p
        return p.stdout

    out = complete(_AENV_COMPLETE="complete_bash", COMP_WORDS=f"aenv rm {two[0]} {sid[:4]}",
                   COMP_CWORD="3")  # fmt: skip
    assert sid in out.split()
    assert "base" in complete(_AENV_COMPLETE="complete_bash", COMP_WORDS="aenv start ba",
                              COMP_CWORD="2").split()  # fmt: skip
    assert sid in complete(_AENV_COMPLETE="complete_zsh",
                           _TYPER_COMPLETE_ARGS=f"aenv cn {sid[:4]}")  # fmt: skip
    assert sid in complete(_AENV_COMPLETE="complete_fish",
                           _TYPER_COMPLETE_ARGS=f"aenv pause {sid[:4]}",
                           _TYPER_COMPLETE_FISH_ACTION="get-args")  # fmt: skip
    # The node being down completes nothing, quietly.
    p = fake_node.cli(env={"_AENV_COMPLETE": "complete_bash", "COMP_WORDS": "aenv rm ",
                           "COMP_CWORD": "2", "AENV_URL": f"http://127.0.0.1:{free_port()}"})
    assert (p.returncode, p.stdout.strip(), p.stderr) == (0, "", "")


# --- auth -------------------------------------------------------------------------------------


def test_auth_saves_0600_and_env_overrides(fake_node: Node, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = cli_env(home)
    p = run_cli("auth", "--url", fake_node.url, "--api-key", "wrong", env=env)
    assert_one_line_error(p, "rejected the API key", "nothing saved")
    cfg = home / ".config" / "aenv" / "config.json"
    assert not cfg.exists()

    p = run_cli("auth", "--url", fake_node.url, "--api-key", "-", env=env,
                input=f"{API_KEY}\n".encode())  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o600
    assert json.loads(cfg.read_text()) == {"url": fake_node.url, "api_key": API_KEY}

    assert run_cli("ls", env=env).returncode == 0
    shown = run_cli("auth", "--show", env=env).stdout
    assert fake_node.url in shown and API_KEY not in shown and str(cfg) in shown
    assert_one_line_error(run_cli("ls", env={**env, "AENV_API_KEY": "bad"}), "$AENV_API_KEY")
    assert run_cli("ls", env={**env, "E2B_API_KEY": API_KEY}).returncode == 0


def test_node_local_key_file(fake_node: Node, tmp_path: Path) -> None:
    """On the node's host, with nothing configured: the node's URL and its api_key file."""
    (tmp_path / "api_key").write_text(API_KEY + "\n")
    env = cli_env(tmp_path, AENV_DATA_DIR=str(tmp_path), AENV_PORT=str(fake_node.port))
    p = run_cli("ls", env=env)
    assert p.returncode == 0, p.stderr
    assert isinstance(json.loads(p.stdout), list)


def test_help_and_version_when_piped() -> None:
    env = cli_env(Path("/nonexistent"))
    p = run_cli("--version", env=env)
    assert (p.returncode, p.stdout.strip()) == (0, "0.1.0")
    p = run_cli("--help", env=env)
    assert p.returncode == 0 and ANSI not in p.stdout
    for cmd in ("start", "ls", "exec", "cn", "pause", "resume", "rm", "timeout", "fork", "logs",
                "snapshot", "upload", "download", "template", "auth", "completion", "server",
                "setup"):
        assert f" {cmd} " in p.stdout, cmd


def test_logs_say_what_the_node_did_also_after_the_end(fake_node: Node) -> None:
    sid = fake_node.cli("start", "-d", "base", "--timeout", "300").stdout.strip()
    for cmd in ("pause", "resume", "rm"):
        assert fake_node.cli(cmd, sid).returncode == 0
    p = fake_node.cli("logs", sid, "--table")  # ended: its whole id still reads its log
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert [ln.split()[2] for ln in lines] == ["sandbox.created", "sandbox.paused",
                                               "sandbox.resumed", "sandbox.killed"], lines
    assert lines[1].split()[1] == "INFO" and "reason=request" in lines[1]
    p = fake_node.cli("logs", sid, "--last", "1", "--json")
    assert [e["message"] for e in json.loads(p.stdout)] == ["sandbox.killed"]
    assert json.loads(fake_node.cli("logs", sid, "--level", "warn").stdout) == []
    assert fake_node.cli("logs", sid, "-s", "PAUSED", "--table").stdout.count("\n") == 1
    assert_one_line_error(fake_node.cli("logs", sid, "--level", "loud"), "--level")
    assert_one_line_error(fake_node.cli("logs", "no-such-id"), "no such sandbox: no-such-id")
