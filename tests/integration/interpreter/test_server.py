"""aenv's code interpreter server (`aenv.interpreter`) on the host, with real IPython
kernels, driven by the unmodified `e2b-code-interpreter` SDK (its `sandbox_url` points it
at the server) and by raw HTTP for what the SDK checks before sending. The sandbox's env
vars come from a small HTTP endpoint standing for the agent's `GET /envs`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from e2b.exceptions import NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import Sandbox

from tests.e2e.scenarios import JS_DIR, npm_ci
from tests.support.host import free_port

pytestmark = pytest.mark.timeout(300)

TOKEN = "agent-token"
SANDBOX_ENVS = {"SANDBOX_VAR": "from-the-sandbox", "SHARED": "sandbox-value"}


class _Envs(BaseHTTPRequestHandler):
    """The agent's GET /envs: the sandbox's env vars, for its access token only."""

    def do_GET(self) -> None:
        ok = self.path == "/envs" and self.headers.get("X-Access-Token") == TOKEN
        body = json.dumps(SANDBOX_ENVS if ok else {"message": "no"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@dataclass(frozen=True)
class Server:
    url: str
    home: Path  # its contexts' directory by default


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    envs = ThreadingHTTPServer(("127.0.0.1", 0), _Envs)
    threading.Thread(target=envs.serve_forever, daemon=True).start()
    port = free_port()
    home = tmp_path_factory.mktemp("interpreter")
    log = home / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aenv.interpreter", "--host", "127.0.0.1",
             "--port", str(port), "--envs-url", f"http://127.0.0.1:{envs.server_port}/envs",
             "--cwd", str(home), "--ipython-dir", str(home / "ipython"),
             "--state-dir", str(home / "state")],
            stdout=out, stderr=subprocess.STDOUT, cwd=Path.home())  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "not healthy within 60 s:\n" + log.read_text()
            time.sleep(0.2)
        yield Server(url, home)
    finally:
        proc.terminate()
        assert proc.wait(20) in (0, -15), log.read_text()  # uvicorn ends by the signal
        envs.shutdown()


@pytest.fixture
def sbx(server: Server) -> Sandbox:
    return Sandbox.connect("debug", debug=True, sandbox_url=server.url)


def _lines(server: Server, body: object, token: str = TOKEN) -> list[dict[str, object]]:
    with httpx.stream("POST", server.url + "/execute", json=body, timeout=60,
                      headers={"X-Access-Token": token}) as r:  # fmt: skip
        assert r.status_code == 200
        return [json.loads(line) for line in r.iter_lines()]


def test_code_runs_keeps_its_state_and_counts_only_what_clients_ran(server: Server,
                                                                   sbx: Sandbox) -> None:
    first = sbx.run_code("x = 41; x + 1", envs={"RUN_VAR": "1"})
    assert first.text == "42" and first.error is None
    again = sbx.run_code("x")
    assert again.text == "41"  # state carries over
    # the env housekeeping before and after the first run counted nothing
    assert again.execution_count == first.execution_count + 1
    assert sbx.run_code("'/home/user'").text == "/home/user"  # a str's repr, unquoted
    assert sbx.run_code("import os; os.getcwd()").text == str(server.home)


def test_output_streams_and_errors_arrive(sbx: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    ex = sbx.run_code("import sys\nprint('hello')\nprint('oops', file=sys.stderr)\nundefined_x",
                      on_stdout=lambda m: out.append(m.line),
                      on_stderr=lambda m: err.append(m.line))  # fmt: skip
    assert out == ["hello\n"] and err == ["oops\n"]
    assert ex.logs.stdout == ["hello\n"]
    assert ex.error is not None and ex.error.name == "NameError"
    assert "undefined_x" in ex.error.value and "NameError" in ex.error.traceback
    shown = sbx.run_code("from IPython.display import Markdown, display\n"
                         "display(Markdown('**b**'))\n7")  # fmt: skip
    assert [(r.markdown, r.is_main_result) for r in shown.results] == [("**b**", False),
                                                                      (None, True)]  # fmt: skip
    assert shown.text == "7"


def test_contexts_are_made_listed_restarted_and_removed(sbx: Sandbox, tmp_path: Path) -> None:
    ctx = sbx.create_code_context(cwd=str(tmp_path))
    assert (ctx.language, ctx.cwd) == ("python", str(tmp_path))
    assert sbx.list_code_contexts()[-1].id == ctx.id  # the newest last
    assert "python" in [c.language for c in sbx.list_code_contexts()]
    assert sbx.run_code("import os; os.getcwd()", context=ctx).text == str(tmp_path)
    sbx.run_code("y = 1", context=ctx)
    assert sbx.run_code("y", context=ctx).text == "1"
    assert sbx.run_code("'y' in dir()").text == "False"  # the default context is another
    sbx.restart_code_context(ctx)
    gone = sbx.run_code("y", context=ctx)
    assert gone.error is not None and gone.error.name == "NameError"
    sbx.remove_code_context(ctx.id)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]
    with pytest.raises(NotFoundException, match=f"Context {ctx.id} not found"):
        sbx.run_code("1", context=ctx)
    with pytest.raises(NotFoundException):
        sbx.restart_code_context(ctx.id)


def test_env_vars_the_sandboxs_and_a_runs_own(server: Server, sbx: Sandbox) -> None:
    ctx = sbx.create_code_context()  # its first run sets the sandbox's env vars
    read = "import os; (os.environ.get('SANDBOX_VAR'), os.environ.get('SHARED'), " \
           "os.environ.get('RUN_ONLY'))"  # fmt: skip
    lines = _lines(server, {"code": read, "context_id": ctx.id,
                            "env_vars": {"SHARED": "run's", "RUN_ONLY": "it's \"quoted\""}})
    main = [ln for ln in lines if ln["type"] == "result"]
    assert main[0]["text"] == "('from-the-sandbox', \"run's\", 'it\\'s \"quoted\"')"
    assert lines[-1] == {"type": "end_of_execution"}
    after = sbx.run_code(read, context=ctx).text
    assert after == "('from-the-sandbox', 'sandbox-value', None)"  # the run's own restored


def test_a_run_past_its_timeout_is_interrupted_and_the_next_runs(sbx: Sandbox) -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.run_code("import time; time.sleep(300)", timeout=3)
    assert time.monotonic() - t0 < 15
    assert sbx.run_code("1 + 1", timeout=20).text == "2"  # the sleep was interrupted


def test_a_silent_run_streams_keepalives(server: Server) -> None:
    lines = _lines(server, {"code": "import time; time.sleep(6); 'done'"})
    kinds = [ln["type"] for ln in lines]
    assert "keepalive" in kinds and kinds[-1] == "end_of_execution"
    assert kinds.index("keepalive") < kinds.index("result")


def test_a_kernel_that_dies_is_replaced(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context()
    dead = sbx.run_code("import os; os._exit(1)", context=ctx, timeout=60)
    assert dead.error is not None and dead.error.name == "KernelDied"
    assert sbx.run_code("2 * 3", context=ctx).text == "6"
    sbx.remove_code_context(ctx)


@pytest.mark.parametrize(("method", "path", "body", "status", "text"), [
    ("POST", "/execute", {"code": "1", "language": "python", "context_id": "x"}, 400,
     "Only one of context_id or language"),
    ("POST", "/execute", {"code": "1", "context_id": "nope"}, 404, "Context nope not found"),
    ("POST", "/execute", {"code": 1}, 422, "code"),
    ("POST", "/execute", {"language": "python"}, 422, "code: required"),
    ("POST", "/execute", {"code": "1", "env_vars": {"A": 1}}, 422, "env_vars"),
    ("POST", "/execute", [1], 422, "object"),
    ("POST", "/execute", {"code": "1", "language": "java"}, 500,
     "no kernel for language 'java'"),
    ("POST", "/contexts", {"language": "cobol"}, 500, "no kernel for language 'cobol'"),
    ("POST", "/contexts", {"cwd": 5}, 422, "cwd"),
    ("POST", "/contexts/nope/restart", None, 404, "Context nope not found"),
    ("DELETE", "/contexts/nope", None, 404, "Context nope not found"),
])  # fmt: skip
def test_bad_requests_get_the_statuses_the_sdks_map(server: Server, method: str, path: str,
                                                    body: object, status: int,
                                                    text: str) -> None:  # fmt: skip
    r = httpx.request(method, server.url + path, json=body, timeout=60)
    assert r.status_code == status and text in r.text, r.text


def test_the_sdk_raises_on_what_the_server_refuses(sbx: Sandbox) -> None:
    with pytest.raises(SandboxException, match="500.*no kernel for language 'java'"):
        sbx.run_code("1", language="java")
    assert sbx.run_code("3", language="python").text == "3"  # the default python context


def test_results_carry_e2b_data_charts_and_json(sbx: Sandbox) -> None:
    """The formatters the server installs in its kernels' profile (formatters.py)."""
    ex = sbx.run_code(
        "class T:\n"
        "    def _repr_e2b_data_(self): return {'a': [1, 2, 3]}\n"
        "    def _repr_e2b_chart_(self):\n"
        "        return {'type': 'unknown', 'title': 'made', 'elements': []}\n"
        "    def __repr__(self): return 'T()'\n"
        "T()")  # fmt: skip
    r = ex.results[0]
    assert (r.text, r.data) == ("T()", {"a": [1, 2, 3]})
    assert r.chart is not None and r.chart.title == "made"
    assert sbx.run_code("{'k': [1, 2], 'n': None}").results[0].json == {"k": [1, 2], "n": None}


def test_bash_runs_in_its_own_context_with_the_envs(server: Server, sbx: Sandbox) -> None:
    lines = _lines(server, {"code": "echo $((6*7)); pwd; echo $SANDBOX_VAR $RUN_ONLY",
                            "language": "bash", "env_vars": {"RUN_ONLY": "it's here"}})
    out = "".join(str(ln["text"]) for ln in lines if ln["type"] == "stdout")
    assert out == f"42\n{server.home}\nfrom-the-sandbox it's here\n", lines
    again = sbx.run_code("echo \"[$RUN_ONLY]\"", language="bash")
    assert "".join(again.logs.stdout) == "[]\n"  # the run's own env var is gone
    assert "bash" in [c.language for c in sbx.list_code_contexts()]


def test_javascript_and_typescript_run_on_deno(server: Server, sbx: Sandbox) -> None:
    """What E2B's own tests ask of the js and ts kernels (e2b-dev/code-interpreter,
    python/tests/sync/test_default_kernels.py), and the sandbox's env vars in js."""
    assert sbx.run_code("console.log('Hello, World!')", language="js").logs.stdout == [
        "Hello, World!\n"]
    imported = sbx.run_code("\n    import { readFileSync } from 'fs'\n"
                            "    console.log(typeof readFileSync)\n    ", language="js")
    assert imported.logs.stdout == ["function\n"]
    waited = sbx.run_code("\n    await Promise.resolve('Hello World!')\n    ", language="js")
    assert waited.text == "Hello World!"
    typed = sbx.run_code("const message: string = 'Hello, World!'; console.log(message)",
                         language="ts")  # fmt: skip
    assert typed.logs.stdout == ["Hello, World!\n"]
    assert sbx.run_code("process.cwd()", language="ts").text == str(server.home)
    lines = _lines(server, {"code": "[process.env.SANDBOX_VAR, process.env.RUN_ONLY]",
                            "language": "js", "env_vars": {"RUN_ONLY": 'a "q"'}})
    shown = [ln["text"] for ln in lines if ln["type"] == "result"]
    assert shown == ["[ \"from-the-sandbox\", 'a \"q\"' ]"], lines
    gone = sbx.run_code("process.env.RUN_ONLY === undefined", language="js")
    assert gone.text == "true"
    err = sbx.run_code("undefinedVar + 1", language="js").error
    assert err is not None and err.name == "ReferenceError"


def test_the_npm_sdk_runs_code(server: Server) -> None:
    """`@e2b/code-interpreter` 2.8.0 (pinned in tests/e2e/js), as a JS trainer calls it."""
    npm_ci()
    r = subprocess.run(["node", "interpreter.mjs"], cwd=JS_DIR, capture_output=True, text=True,
                       env={**os.environ, "URL": server.url, "JS": "1", "NO_COLOR": "1"},
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"text": "2", "count": 1, "stdout": ["from js\n"],
                                    "error": "NameError", "js": "42"}


def test_a_context_removed_or_restarted_mid_run_ends_that_run(server: Server,
                                                              sbx: Sandbox) -> None:  # fmt: skip
    for change in ("restart", "remove"):
        ctx = sbx.create_code_context()
        got: list[list[dict[str, object]]] = []
        t = threading.Thread(target=lambda c=ctx, g=got: g.append(  # type: ignore[misc]
            _lines(server, {"code": "import time; time.sleep(60)", "context_id": c.id})))
        t.start()
        time.sleep(2)
        if change == "restart":
            sbx.restart_code_context(ctx)
        else:
            sbx.remove_code_context(ctx)
        t.join(30)
        assert not t.is_alive() and got, change
        errors = [ln["name"] for ln in got[0] if ln["type"] == "error"]
        assert errors == ["ContextRestarting"] and got[0][-1]["type"] == "end_of_execution"
    assert sbx.run_code("5").text == "5"
