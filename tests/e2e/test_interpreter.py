"""The code interpreter in real VMs: the `code-interpreter-minimal` recipe (the python kernel
only) built by `aenv template build --recipe`, and the unmodified `e2b-code-interpreter` SDK
reaching its server on port 49999 through the node's proxy. The server's protocol in depth
is tests/integration/interpreter/ (host kernels); the full `code-interpreter-v1` and the
upstream suite are `make test-long`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b.exceptions import SandboxException, TimeoutException
from e2b_code_interpreter import Sandbox

from tests.e2e.conftest import API_KEY, DATA_DIR, NodeProcess, running_node
from tests.e2e.scenarios import JS_DIR, npm_ci

pytestmark = pytest.mark.timeout(600)
NAME = "ci-interpreter"
RECIPE = "code-interpreter-minimal"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node with the template built (from nothing each time: the build is what is timed)."""
    log = tmp_path_factory.mktemp("build") / "build.log"
    started = time.monotonic()
    with log.open("wb") as out:
        argv = [sys.executable, "-m", "aenv.cli.main", "template", "build", NAME, "--recipe",
                RECIPE, "--force"]  # fmt: skip
        built = subprocess.run(argv, env={**os.environ, "AENV_DATA_DIR": str(DATA_DIR)},
                               stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               timeout=500)  # fmt: skip
    assert built.returncode == 0, log.read_text()[-3000:]
    print(f"{RECIPE} built in {time.monotonic() - started:.0f} s")
    with running_node(tmp_path_factory.mktemp("node")) as n:
        try:
            yield n
        finally:
            with n.api() as api:
                assert api.delete(f"/templates/{NAME}").status_code == 204


@pytest.fixture(scope="module")
def sbx(node: NodeProcess) -> Iterator[Sandbox]:
    s = Sandbox.create(NAME, timeout=600, envs={"FROM_CREATE": "the-sandbox"})
    try:
        yield s
    finally:
        s.kill()


def test_code_runs_with_state_output_errors_and_counts(sbx: Sandbox) -> None:
    first = sbx.run_code("1+1")
    assert first.text == "2" and first.execution_count is not None
    sbx.run_code("x = 41")
    seen: list[str] = []
    r = sbx.run_code("print('out', x + 1)", on_stdout=lambda m: seen.append(m.line))
    assert r.logs.stdout == ["out 42\n"] and seen == ["out 42\n"]
    assert r.execution_count == first.execution_count + 2
    err = sbx.run_code("undefined_name")
    assert err.error is not None and err.error.name == "NameError"


def test_env_vars_of_the_sandbox_and_of_a_run(sbx: Sandbox) -> None:
    assert sbx.run_code("import os; os.environ['FROM_CREATE']").text == "the-sandbox"
    assert sbx.run_code("os.environ['RUN']", envs={"RUN": "1"}).text == "1"
    assert sbx.run_code("os.environ.get('RUN')").text is None


def test_a_context_of_its_own(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context(cwd="/tmp")
    assert sbx.run_code("import os; os.getcwd()", context=ctx).text == "/tmp"
    assert sbx.run_code("'x' in globals()", context=ctx).text == "False"
    assert ctx.id in {c.id for c in sbx.list_code_contexts()}
    sbx.remove_code_context(ctx)
    assert ctx.id not in {c.id for c in sbx.list_code_contexts()}


def test_a_run_past_its_timeout_is_interrupted_and_the_next_runs(sbx: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sbx.run_code("import time; time.sleep(300)", timeout=3)
    assert sbx.run_code("1+1").text == "2"


def _server_pid(sbx: Sandbox) -> str:
    return sbx.commands.run("pgrep -f '^python3 -m aenv.interpreter'", user="root").stdout.strip()


@pytest.mark.long  # ~40 s
def test_a_killed_server_comes_back(sbx: Sandbox) -> None:
    before = _server_pid(sbx)
    assert before.isdigit(), before
    sbx.commands.run(f"kill -9 {before}", user="root")
    deadline = time.monotonic() + 120
    while True:
        try:
            if sbx.run_code("2+2", request_timeout=30).text == "4":
                break
        except Exception as e:  # refused or 502 while it starts again
            assert time.monotonic() < deadline, f"the server did not come back: {e}"
            time.sleep(1)
    after = _server_pid(sbx)
    assert after.isdigit() and after != before
    assert sbx.run_code("x").error is not None  # a new kernel: the old state is gone


def test_port_49999_needs_the_traffic_token_when_traffic_is_not_public(node: NodeProcess) -> None:
    s = Sandbox.create(NAME, timeout=120, network={"allow_public_traffic": False})
    try:
        assert s.run_code("1+1").text == "2"  # the SDK sends the token
        r = httpx.get(f"{node.origin}/health",
                      headers={"E2b-Sandbox-Id": s.sandbox_id, "E2b-Sandbox-Port": "49999"})
        assert r.status_code == 403, r.text
    finally:
        s.kill()


def test_the_npm_sdk_runs_code_in_a_sandbox(node: NodeProcess) -> None:
    """`@e2b/code-interpreter` 2.8.0 (pinned in tests/e2e/js) against the node."""
    npm_ci()
    env = {**os.environ, "TEMPLATE": NAME, "E2B_API_URL": node.origin,
           "E2B_SANDBOX_URL": node.origin, "E2B_API_KEY": API_KEY, "NO_COLOR": "1"}  # fmt: skip
    r = subprocess.run(["node", "interpreter.mjs"], cwd=JS_DIR, capture_output=True, text=True,
                       env=env, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"text": "2", "count": 1, "stdout": ["from js\n"],
                                    "error": "NameError", "js": None}


def test_a_recipe_not_built_here_names_the_command_that_builds_it(node: NodeProcess) -> None:
    with pytest.raises(SandboxException, match=f"404: .*`aenv setup -t {RECIPE}` builds it"):
        Sandbox.create(RECIPE, timeout=60)  # (this test builds it under another name)
