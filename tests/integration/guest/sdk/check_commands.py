"""commands.* through the unmodified SDK (sync Sandbox): checklist items 4 and 5."""

from __future__ import annotations

import time

import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    TimeoutException,
)


def _running(sbx: Sandbox) -> set[int]:
    return {p.pid for p in sbx.commands.list()}


def test_run_echo_as_default_user_in_home(sbx: Sandbox) -> None:
    r = sbx.commands.run("echo hi; whoami; pwd")
    assert r.stdout == "hi\nuser\n/home/user\n"
    assert r.stderr == ""
    assert r.exit_code == 0
    assert r.error is None


def test_run_true(sbx: Sandbox) -> None:
    assert sbx.commands.run("true").exit_code == 0


def test_nonzero_exit_carries_output_and_status(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as ei:
        sbx.commands.run("echo out; echo err >&2; exit 3")
    e = ei.value
    assert (e.exit_code, e.stdout, e.stderr, e.error) == (3, "out\n", "err\n", "exit status 3")


def test_env_order_sandbox_vars_then_request_envs(sbx: Sandbox) -> None:
    cmd = 'echo "$HOME|$USER|$LOGNAME|$AENVT_SANDBOX_VAR|$AENVT_SHADOWED|$PER_CALL"'
    r = sbx.commands.run(cmd, envs={"AENVT_SHADOWED": "request", "PER_CALL": "x"})
    assert r.stdout == "/home/user|user|user|from-init|request|x\n"
    # Per-call envs do not leak into later commands.
    assert sbx.commands.run(cmd).stdout == "/home/user|user|user|from-init|sandbox|\n"


def test_user_and_cwd(sbx: Sandbox) -> None:
    r = sbx.commands.run("whoami; pwd; echo $HOME", user="root", cwd="/tmp")
    assert r.stdout == "root\n/tmp\n/root\n"


def test_missing_cwd_is_invalid_argument(sbx: Sandbox) -> None:
    with pytest.raises(InvalidArgumentException):
        sbx.commands.run("true", cwd="/does/not/exist")


def test_unknown_user_is_unauthenticated(sbx: Sandbox) -> None:
    with pytest.raises(AuthenticationException):
        sbx.commands.run("true", user="nosuchuser")


def test_timeout_raises_and_agent_kills_the_process(sbx: Sandbox) -> None:
    marker = f"sleep 9{time.time_ns() % 1000:03d}"
    with pytest.raises(TimeoutException):
        sbx.commands.run(marker, timeout=1)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not any(p.args[-1:] == [marker] for p in sbx.commands.list()):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the timed-out process is still running")


def test_background_list_kill_wait(sbx: Sandbox) -> None:
    h = sbx.commands.run("sleep 30", background=True, envs={"A": "1"}, cwd="/tmp")
    info = next(p for p in sbx.commands.list() if p.pid == h.pid)
    assert (info.cmd, info.args, info.envs, info.cwd) == (
        "/bin/bash",
        ["-l", "-c", "sleep 30"],
        {"A": "1"},
        "/tmp",
    )
    assert h.kill() is True
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert (ei.value.exit_code, ei.value.error) == (-1, "signal: killed")
    assert h.pid not in _running(sbx)
    assert sbx.commands.kill(999_999) is False


def test_deadline_kills_only_its_own_pid(sbx: Sandbox) -> None:
    out: list[str] = []
    h = sbx.commands.run("sleep 60 >/dev/null 2>&1 & echo $!; sleep 60", background=True, timeout=1)
    with pytest.raises((TimeoutException, CommandExitException)):
        h.wait(on_stdout=out.append)
    child = int("".join(out).split()[0])
    deadline = time.monotonic() + 5
    while h.pid in _running(sbx):
        assert time.monotonic() < deadline, "the agent did not kill the process at its deadline"
        time.sleep(0.05)
    # The background child lives on; clean it up.
    assert sbx.commands.run(f"kill -0 {child} && kill {child}").exit_code == 0


def test_disconnect_keeps_process_and_connect_gets_live_output(sbx: Sandbox) -> None:
    # "late" is printed only once we are connected again (a trigger file, not a sleep: a busy
    # host may take longer than any fixed delay to get there).
    go = f"/tmp/go-{time.monotonic_ns()}"
    h = sbx.commands.run(f"while [ ! -e {go} ]; do sleep 0.05; done; echo late; sleep 30",
                         background=True, timeout=0)  # fmt: skip
    h.disconnect()
    assert h.pid in _running(sbx)
    h2 = sbx.commands.connect(h.pid, timeout=0)
    sbx.files.write(go, "")
    seen: list[str] = []
    for stdout, _stderr, _pty in h2:
        if stdout:
            seen.append(stdout)
            break
    assert seen == ["late\n"]
    assert sbx.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException):
        h2.wait()


def test_connect_unknown_pid_is_not_found(sbx: Sandbox) -> None:
    with pytest.raises(NotFoundException):
        sbx.commands.connect(999_998)


def test_stdin_send_and_close(sbx: Sandbox) -> None:
    h = sbx.commands.run("read x; echo got $x; cat", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "abc\n")
    sbx.commands.send_stdin(h.pid, b"rest")
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "got abc\nrest"


def test_stream_input(sbx: Sandbox) -> None:
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(h.pid, iter(["one ", b"two ", "three"]))
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "one two three"


def test_stdin_false_reads_eof(sbx: Sandbox) -> None:
    assert sbx.commands.run("cat; echo done").stdout == "done\n"


def test_huge_output_streams_in_bounded_chunks(sbx: Sandbox) -> None:
    chunks: list[str] = []
    r = sbx.commands.run("head -c 12000000 /dev/zero | tr '\\0' x", on_stdout=chunks.append)
    assert len(r.stdout) == 12_000_000
    assert set(r.stdout) == {"x"}
    assert max(len(c) for c in chunks) <= 32 * 1024
    assert sbx.commands.run("echo alive").stdout == "alive\n"


def test_binary_output_does_not_break_the_stream(sbx: Sandbox) -> None:
    r = sbx.commands.run("printf 'a\\xff\\xfe\\x00b'; printf '\\xe2\\x82' ; printf '\\xac\\n'")
    assert r.stdout.startswith("a") and r.stdout.endswith("€\n")


def test_signal_exit_status_for_sigterm_and_self_kill(sbx: Sandbox) -> None:
    with pytest.raises(CommandExitException) as ei:
        sbx.commands.run("kill -TERM $$")
    assert (ei.value.exit_code, ei.value.error) == (-1, "signal: terminated")


def test_background_writer_holding_the_pipe_does_not_stall_the_end(sbx: Sandbox) -> None:
    # `yes` inherits stdout and keeps writing after bash exits: the end must still come.
    t0 = time.monotonic()
    try:
        r = sbx.commands.run("yes & sleep 0.2", timeout=30)
        assert r.exit_code == 0 and r.stdout.startswith("y\n")
        assert time.monotonic() - t0 < 10
    finally:
        assert sbx.commands.run("pkill -x yes; echo ok", user="root").stdout == "ok\n"
