"""e2b-compat.md section 12, minus pause/resume: what the unmodified `e2b` SDK does against
a live endpoint, a node (test_acceptance.py) or a cluster's gateway (test_gateway.py).

Written fresh from the spec; only the public `e2b` API is used.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FileNotFoundException,
    FilesystemEventType,
    Sandbox,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)
from e2b.exceptions import SandboxNotFoundException

from tests.support.timing import scaled


def sync_sdk_scenario() -> None:
    """Section 12 through the sync SDK, wherever its env points (a node, a gateway)."""
    suite = str(uuid.uuid4())
    # 1. create
    sbx = Sandbox.create(timeout=120, metadata={"suite": suite}, envs={"FOO": "bar"})
    try:
        assert sbx.is_running()

        # 2. commands and env vars
        r = sbx.commands.run("echo hi")
        assert (r.stdout, r.exit_code) == ("hi\n", 0)
        assert sbx.commands.run("echo $FOO").stdout == "bar\n"
        assert sbx.commands.run("echo $X", envs={"X": "per-call"}).stdout == "per-call\n"
        assert sbx.commands.run("echo ${X:-unset}").stdout == "unset\n"

        # 3. failures and deadlines
        with pytest.raises(CommandExitException) as e:
            sbx.commands.run("echo err >&2; exit 3")
        assert e.value.exit_code == 3 and e.value.stderr == "err\n"
        with pytest.raises(TimeoutException):
            sbx.commands.run("sleep 10", timeout=1)

        # 4. background, kill, stdin
        h = sbx.commands.run("sleep 30", background=True)
        assert h.pid in [p.pid for p in sbx.commands.list()]
        assert h.kill() is True
        with pytest.raises(CommandExitException):
            h.wait()
        assert sbx.commands.kill(999999) is False
        h = sbx.commands.run("read x; echo got $x", background=True, stdin=True)
        sbx.commands.send_stdin(h.pid, "abc\n")
        assert h.wait().stdout == "got abc\n"

        # 5. files
        info = sbx.files.write("d/a.txt", "hello")
        assert info.path == "/home/user/d/a.txt"
        assert sbx.files.read("d/a.txt") == "hello"
        sbx.files.write_files([{"path": "d/c.txt", "data": "c"}, {"path": "d/b.txt", "data": "b"}])
        entries = sbx.files.list("d")
        assert [x.name for x in entries] == ["a.txt", "b.txt", "c.txt"]
        assert all(x.path.startswith("/home/user/d/") for x in entries)
        assert sbx.files.exists("d/a.txt") and not sbx.files.exists("d/nope")
        assert sbx.files.make_dir("m") is True and sbx.files.make_dir("m") is False
        moved = sbx.files.rename("d/a.txt", "n/e/w.txt")
        assert moved.path == "/home/user/n/e/w.txt" and not sbx.files.exists("d/a.txt")
        assert sbx.commands.run("cat /home/user/n/e/w.txt").stdout == "hello"
        sbx.files.remove("d")
        assert not sbx.files.exists("d")
        sbx.files.remove("does/not/exist")
        with pytest.raises(FileNotFoundException):
            sbx.files.read("missing")
        with pytest.raises(FileNotFoundException):
            sbx.files.rename("missing", "elsewhere")

        # 6. watch
        sbx.files.make_dir("w")
        wh = sbx.files.watch_dir("w")
        sbx.files.write("w/f.txt", "1")
        events = wh.get_new_events()
        kinds = {ev.type for ev in events if ev.name == "f.txt"}
        assert FilesystemEventType.CREATE in kinds and FilesystemEventType.WRITE in kinds
        wh.stop()

        # 7. control plane
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id and info.metadata == {"suite": suite}
        assert info.state == SandboxState.RUNNING
        before = info.end_at
        sbx.set_timeout(600)
        assert sbx.get_info().end_at > before
        q = SandboxQuery(metadata={"suite": suite})
        assert sbx.sandbox_id in [s.sandbox_id for s in Sandbox.list(query=q).next_items()]
        second = Sandbox.create(timeout=120, metadata={"suite": suite})
        try:
            pages = Sandbox.list(query=q, limit=1)
            first_page = pages.next_items()
            assert [s.sandbox_id for s in first_page] == [second.sandbox_id] and pages.has_next
            assert [s.sandbox_id for s in pages.next_items()] == [sbx.sandbox_id]
            assert not pages.has_next
        finally:
            assert second.kill() is True

        # checklist 19: a kill ends an open command stream with a timeout-class error
        failure: list[BaseException] = []

        def run_long() -> None:
            try:
                sbx.commands.run("sleep 60")
            except BaseException as exc:
                failure.append(exc)

        t = threading.Thread(target=run_long)
        t.start()
        time.sleep(1.5)
        # 9. kill
        t0 = time.monotonic()
        assert sbx.kill() is True
        t.join(30)
        assert not t.is_alive() and time.monotonic() - t0 < 30
        assert failure and isinstance(failure[0], TimeoutException), failure
        assert Sandbox.kill(sbx.sandbox_id) is False
        assert not sbx.is_running()
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(sbx.sandbox_id)
        with pytest.raises(TimeoutException):  # SandboxNotRunningException
            sbx.commands.run("echo gone")
    finally:
        Sandbox.kill(sbx.sandbox_id)

    # 10. TTL
    short = Sandbox.create(timeout=60, metadata={"suite": suite})
    short.set_timeout(3)
    time.sleep(3)
    deadline = time.monotonic() + scaled(30)  # killed at endAt; seen once the kill is done
    while short.is_running():
        assert time.monotonic() < deadline, "the sandbox outlived its timeout"
        time.sleep(0.25)
    assert short.sandbox_id not in [s.sandbox_id for s in Sandbox.list(query=q).next_items()]



def async_sdk_scenario() -> None:
    """Section 12 through the async SDK."""
    async def scenario() -> None:
        suite = str(uuid.uuid4())
        sbx = await AsyncSandbox.create(timeout=120, metadata={"suite": suite},
                                        envs={"FOO": "bar"})  # fmt: skip
        try:
            assert await sbx.is_running()
            out: list[str] = []
            err: list[str] = []
            r = await sbx.commands.run("echo $FOO; echo oops >&2", on_stdout=out.append,
                                       on_stderr=err.append)  # fmt: skip
            assert r.stdout == "bar\n" and "".join(out) == "bar\n" and "".join(err) == "oops\n"

            h = await sbx.commands.run("sleep 30", background=True)
            assert h.pid in [p.pid for p in await sbx.commands.list()]
            assert await h.kill() is True
            with pytest.raises(CommandExitException):
                await h.wait()

            info = await sbx.files.write("d/a.txt", "hello")
            assert info.path == "/home/user/d/a.txt"
            assert await sbx.files.read("d/a.txt") == "hello"
            assert [e.name for e in await sbx.files.list("d")] == ["a.txt"]
            assert await sbx.files.exists("d/a.txt")
            assert await sbx.files.make_dir("m") is True
            await sbx.files.rename("d/a.txt", "x/y.txt")
            assert not await sbx.files.exists("d/a.txt")
            await sbx.files.remove("x")
            assert not await sbx.files.exists("x")

            await sbx.files.make_dir("w")
            seen = asyncio.Event()

            def on_event(ev) -> None:  # type: ignore[no-untyped-def]
                if ev.name == "f.txt" and ev.type == FilesystemEventType.CREATE:
                    seen.set()

            wh = await sbx.files.watch_dir("w", on_event=on_event)
            await sbx.files.write("w/f.txt", "1")
            await asyncio.wait_for(seen.wait(), scaled(10))
            await wh.stop()

            before = (await sbx.get_info()).end_at
            await sbx.set_timeout(600)
            info = await sbx.get_info()
            assert info.end_at > before and info.state == SandboxState.RUNNING
            query = SandboxQuery(metadata={"suite": suite})
            listed = await AsyncSandbox.list(query=query).next_items()
            assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
            same = await AsyncSandbox.connect(sbx.sandbox_id)
            assert (await same.commands.run("echo again")).stdout == "again\n"

            assert await sbx.kill() is True
            assert await AsyncSandbox.kill(sbx.sandbox_id) is False
            assert not await sbx.is_running()
        finally:
            await AsyncSandbox.kill(sbx.sandbox_id)

    asyncio.run(scenario())


JS_DIR = Path(__file__).parent / "js"
STAMP = JS_DIR / "node_modules" / ".aenv-lock-sha256"


def npm_ci() -> None:
    want = hashlib.sha256((JS_DIR / "package-lock.json").read_bytes()).hexdigest()
    if STAMP.is_file() and STAMP.read_text().strip() == want:
        return
    r = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=JS_DIR, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, f"npm ci failed:\n{r.stdout}\n{r.stderr}"
    STAMP.write_text(want + "\n")


def _js_env(origin: str, api_key: str) -> dict[str, str]:
    env = {**os.environ, "E2B_API_URL": origin, "E2B_SANDBOX_URL": origin,
           "E2B_API_KEY": api_key, "NO_COLOR": "1"}  # fmt: skip
    env.pop("E2B_DOMAIN", None)
    env.pop("E2B_DEBUG", None)
    return env


def e2b_cli(origin: str, api_key: str, *args: str) -> str:
    """The unmodified npm `@e2b/cli` (pinned beside the SDK in tests/e2e/js) against
    `origin`: its stdout; a failure fails the test with its output."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node and npm are needed (scripts/install-host-deps.sh installs nodejs)")
    npm_ci()
    r = subprocess.run(["node", str(JS_DIR / "node_modules/@e2b/cli/dist/index.js"), *args],
                       cwd=JS_DIR, env=_js_env(origin, api_key), capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, f"e2b {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def js_sdk_scenario(origin: str, api_key: str, tail: Callable[[], str]) -> None:
    """tests/e2e/js/*.test.mjs under `node --test`, the npm SDK's env pointed at `origin`.
    `npm ci` runs once per lock file (node_modules/ is kept, keyed by the lock's hash)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node and npm are needed (scripts/install-host-deps.sh installs nodejs)")
    npm_ci()
    env = _js_env(origin, api_key)
    files = sorted(p.name for p in JS_DIR.glob("*.test.mjs"))
    assert files, f"no *.test.mjs under {JS_DIR}"
    r = subprocess.run(
        ["node", "--test", "--test-reporter=tap", *files],
        cwd=JS_DIR, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = f"{r.stdout}\n{r.stderr}"
    assert r.returncode == 0, f"node --test failed:\n{out}\n{tail()}"
    passed = re.search(r"^# pass (\d+)$", r.stdout, re.M)
    assert passed and int(passed.group(1)) > 0 and "# fail 0" in r.stdout, out
