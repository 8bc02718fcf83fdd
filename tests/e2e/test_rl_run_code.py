"""SandboxFusion's `run_code` on a real node (issue 32, verl's `reward.sandbox_fusion.url`):
the body exactly as verl 0.9.1 builds it (pinned here: verl imports torch, so the test sends
its request rather than running verl), no API key, programs in forks of `base`."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from .conftest import NodeProcess
from .test_rl import _delta, _rl_ops, _sandboxes, _snapshot_dirs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def verl_body(code: str, stdin: str | None, language: str = "python",
              compile_timeout: int = 10, run_timeout: int = 10) -> dict[str, Any]:  # fmt: skip
    """verl/utils/reward_score/sandbox_fusion/utils.py (call_sandbox_api), verl 0.9.1."""
    return {"compile_timeout": compile_timeout, "run_timeout": run_timeout, "code": code,
            "stdin": stdin, "memory_limit_MB": 1024, "language": language, "files": {},
            "fetch_files": []}  # fmt: skip


def test_verls_sandbox_fusion_requests_get_sandbox_fusions_answers(node: NodeProcess) -> None:
    with node.api() as c:
        before_sandboxes, before_dirs = _sandboxes(node), _snapshot_dirs()
        got = c.get("/rl/run_code").json()
    url = got["url"]
    ops0 = _rl_ops(node)

    def post(body: dict[str, Any]) -> dict[str, Any]:
        r = httpx.post(url, json=body, timeout=120)  # no API key, as verl sends
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        assert set(doc) >= {"status", "message", "compile_result", "run_result", "files"}
        return doc

    cases = {
        "echo": verl_body("import sys\nn = int(input())\nprint(n * 2)\n"
                          "print('to stderr', file=sys.stderr)\n", "21\n"),
        "leave": verl_body("open('/tmp/left-behind', 'w').write('x')\nprint('ok')", None),
        "exit": verl_body("raise SystemExit(3)", None),
        "tle": verl_body("while True:\n    pass\n", None, run_timeout=2),
        "memory": verl_body("b = bytearray(1536 << 20)\nprint(len(b))", None),
        "cpp_bad": verl_body("int main( { return 0; }", None, language="cpp"),
        # <cstdio>, not <iostream>: g++ under TCG on a busy host needs tens of seconds for
        # the latter; verl's compile_timeout is its run timeout, a setting (60 s here).
        "cpp": verl_body("#include <cstdio>\nint main(){int a,b;scanf(\"%d %d\",&a,&b);"
                         "printf(\"%d\\n\",a+b);}", "2 40\n", language="cpp",
                         compile_timeout=60),
        "files": verl_body("print(open('data/in.txt').read().upper())\n"
                           "open('out.txt', 'w').write('made')", None)
        | {"files": {"data/in.txt": base64.b64encode(b"from files").decode()},
           "fetch_files": ["out.txt", "missing.txt"]},
    }
    with ThreadPoolExecutor(4) as pool:
        res = dict(zip(cases, pool.map(post, cases.values()), strict=True))
    # The next call sees nothing a previous one left (each runs in its own fork).
    res["after"] = post(verl_body("import os\nprint(os.path.exists('/tmp/left-behind'))", None))

    ok = res["echo"]
    assert ok["status"] == "Success", ok
    rr = ok["run_result"]
    assert rr["status"] == "Finished" and rr["return_code"] == 0
    assert rr["stdout"].rstrip("\n") == "42" and "to stderr" in rr["stderr"]
    assert isinstance(rr["execution_time"], float) and ok["compile_result"] is None
    assert res["leave"]["status"] == "Success"
    assert res["after"]["run_result"]["stdout"].strip() == "False"
    assert res["exit"]["status"] == "Failed"
    assert res["exit"]["run_result"] | {"execution_time": 0, "stderr": ""} == {
        "status": "Error", "return_code": 3, "stdout": "", "stderr": "", "execution_time": 0}
    tle = res["tle"]
    assert tle["status"] == "Failed" and tle["run_result"]["status"] == "TimeLimitExceeded"
    assert 2 <= tle["run_result"]["execution_time"] < 10
    mem = res["memory"]  # 1.5 GiB under verl's 1024 MB limit
    assert mem["status"] == "Failed" and "MemoryError" in mem["run_result"]["stderr"], mem
    bad = res["cpp_bad"]
    assert bad["status"] == "Failed" and bad["run_result"] is None
    assert bad["compile_result"]["status"] == "Error" and "error" in bad["compile_result"]["stderr"]
    cpp = res["cpp"]
    assert cpp["status"] == "Success" and cpp["run_result"]["stdout"] == "42\n", cpp
    assert cpp["compile_result"]["status"] == "Finished"
    f = res["files"]
    assert f["status"] == "Success" and f["run_result"]["stdout"].strip() == "FROM FILES", f
    assert f["files"] == {"out.txt": base64.b64encode(b"made").decode()}

    ops = _rl_ops(node)
    assert _delta(ops, ops0, ("run_code", "Success")) == 5
    assert _delta(ops, ops0, ("run_code", "Failed")) == 4
    assert _delta(ops, ops0, ("setup", "ok")) == 1  # one start state for all of them
    # Ending the team's run-code group leaves nothing: no VMs, no start state.
    with node.api() as c:
        assert c.delete("/rl/run_code").status_code == 204
    assert _sandboxes(node) == before_sandboxes
    assert _snapshot_dirs() == before_dirs
