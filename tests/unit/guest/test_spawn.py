"""spawn(): the static aenv-exec helper and the Python fallback do the same steps.

Real processes on the host, as root: the child reports its credentials, nice value,
OOM score and session, and writes to a stand-in for the cgroup's ``cgroup.procs``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from aenv.guest.agent.spawn import SpawnPolicy, spawn
from aenv.guest.agent.users import User
from aenv.storage.tools import build_exec_helper

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")

NOBODY = User(name="nobody", uid=65534, gid=65534, home="/nonexistent", groups=(65534, 100))
ROOT = User(name="root", uid=0, gid=0, home="/root", groups=(0,))
REPORT = (
    'echo "$(id -u) $(id -g) $(id -G)"; '
    "awk '{print $19}' /proc/self/stat; cat /proc/self/oom_score_adj; "
    "ps -o sid= -p $$ | tr -d ' '; echo $$"
)


@pytest.fixture(scope="module")
def helper(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_exec_helper(tmp_path_factory.mktemp("helper") / "aenv-exec"))


def _run(policy: SpawnPolicy, argv: list[str], user: User = NOBODY) -> list[str]:
    r, w = os.pipe()
    try:
        p = spawn(argv, env={"PATH": "/usr/bin:/bin"}, cwd="/", user=user,
                  stdin=subprocess.DEVNULL, stdout=w, stderr=w, policy=policy)
    finally:
        os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    assert p.wait(timeout=30) == 0, out
    return out.split("\n")


@pytest.mark.parametrize("use_helper", [True, False], ids=["aenv-exec", "preexec_fn"])
def test_the_child_gets_user_nice_oom_session_and_cgroup(
    use_helper: bool, helper: str, tmp_path: Path
) -> None:
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    procs.chmod(0o666)
    policy = SpawnPolicy(cgroup_procs=str(procs), oom_score_adj=700, nice=5,
                         exec_helper=helper if use_helper else None)
    ids, nice, oom, sid, pid = _run(policy, ["/bin/sh", "-c", REPORT])[:5]
    assert ids == "65534 65534 65534 100"
    assert (nice, oom) == ("5", "700")
    assert sid == pid  # a session leader of its own
    assert procs.read_text() == "0"  # "join the cgroup I am in", written by the child


def test_root_commands_go_to_the_root_leaf_and_keep_root(helper: str, tmp_path: Path) -> None:
    user_leaf, root_leaf = tmp_path / "user.procs", tmp_path / "root.procs"
    for p in (user_leaf, root_leaf):
        p.write_text("")
    policy = SpawnPolicy(cgroup_procs=str(user_leaf), root_cgroup_procs=str(root_leaf),
                         oom_score_adj=100, exec_helper=helper)
    assert _run(policy, ["/bin/sh", "-c", REPORT], user=ROOT)[0] == "0 0 0"
    assert (user_leaf.read_text(), root_leaf.read_text()) == ("", "0")


@pytest.mark.parametrize("use_helper", [True, False], ids=["aenv-exec", "preexec_fn"])
def test_a_program_that_cannot_run_is_an_oserror_as_from_popen(
    use_helper: bool, helper: str, tmp_path: Path
) -> None:
    policy = SpawnPolicy(oom_score_adj=700, exec_helper=helper if use_helper else None)
    with pytest.raises(FileNotFoundError) as e:
        _run(policy, ["no-such-program-here"])
    assert "no-such-program-here" in str(e.value)
    not_executable = tmp_path / "data"
    not_executable.write_text("echo hi\n")
    with pytest.raises(PermissionError):
        _run(policy, [str(not_executable)], user=ROOT)
    no_shebang = tmp_path / "script"
    no_shebang.write_text("echo hi\n")
    no_shebang.chmod(0o755)
    with pytest.raises(OSError, match="Exec format error"):  # no /bin/sh fallback
        _run(policy, [str(no_shebang)], user=ROOT)


def test_a_step_that_fails_is_a_subprocess_error(helper: str) -> None:
    # TIOCSCTTY on a stdin that is no terminal: the helper stops before exec, reports the
    # step, and leaves no process behind.
    policy = SpawnPolicy(exec_helper=helper)
    with pytest.raises(subprocess.SubprocessError, match="ctty failed"):
        spawn(["/bin/true"], env={}, cwd="/", user=NOBODY, stdin=subprocess.DEVNULL,
              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, policy=policy, ctty=True)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)
