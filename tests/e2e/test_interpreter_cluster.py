"""`code-interpreter-v1` (made first if this host has not: `aenv setup -t`) as a production
client reaches it: the unmodified `e2b-code-interpreter` in a client namespace, given
E2B_DOMAIN alone, through haproxy and two gateways over TLS to a cluster's node
(test_gateway.tls_front). Its NDJSON must arrive as it is printed, and a client that leaves
must have the kernel interrupted at once (the gateway closes the node's stream). The npm
`@e2b/code-interpreter` then does the same, its javascript kernel included."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import DATA_DIR
from .scenarios import JS_DIR, npm_ci
from .test_gateway import REPO, Cluster, cluster, tls_front  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.timeout(1800)]
TEMPLATE = "code-interpreter-v1"
CLIENT = """
import time
from e2b import TimeoutException
from e2b_code_interpreter import Sandbox

s = Sandbox.create("code-interpreter-v1", timeout=600)
try:
    t0 = time.monotonic()
    assert s.run_code("1+1").text == "2"
    print(f"first run_code {time.monotonic() - t0:.2f} s")
    seen = []
    s.run_code("import time\\nfor i in range(3):\\n    print(i, flush=True)\\n    time.sleep(2)",
               on_stdout=lambda m: seen.append(time.monotonic()))
    assert len(seen) == 3 and seen[-1] - seen[0] > 3, seen  # as printed, not at the end
    r = s.run_code("import matplotlib.pyplot as plt\\nplt.plot([1, 2, 3], [1, 4, 9])\\nplt.show()")
    assert r.results and r.results[0].chart is not None and r.results[0].png, r
    r = s.run_code("import pandas as pd\\npd.DataFrame({'a': [1, 2]})")
    assert r.results and r.results[0].data is not None, r
    assert s.run_code("1 + 2", language="js").text == "3"
    t0 = time.monotonic()
    try:
        s.run_code("import time; time.sleep(300)", timeout=3)
        raise AssertionError("no timeout")
    except TimeoutException:
        pass
    assert s.run_code("x = 1; x").text == "1"
    print(f"the next run after a client left ran {time.monotonic() - t0:.1f} s after it")
    assert time.monotonic() - t0 < 30  # interrupted, not left to sleep 300 s
finally:
    s.kill()
print("ok")
"""


def _built() -> None:
    if (DATA_DIR / "templates" / TEMPLATE / "template.json").exists():
        return
    subprocess.run([sys.executable, "-m", "aenv.cli.main", "setup", "-t", TEMPLATE],
                   check=True, timeout=1200)  # fmt: skip


def test_code_interpreter_v1_through_gateways_over_tls(cluster: Cluster,  # noqa: F811
                                                       tmp_path: Path) -> None:  # fmt: skip
    _built()
    npm_ci()
    with tls_front(cluster, tmp_path) as (ns, env):
        r = ns.run([sys.executable, "-c", CLIENT], env, timeout=900, cwd=REPO)
        # The npm `@e2b/code-interpreter` the same way (Node trusts the test CA by
        # NODE_EXTRA_CA_CERTS), its javascript kernel too.
        js = ns.run(["node", "interpreter.mjs"], {
            **env, "TEMPLATE": TEMPLATE, "JS": "1", "NODE_EXTRA_CA_CERTS": env["SSL_CERT_FILE"],
            "NO_COLOR": "1"}, timeout=300, cwd=JS_DIR)  # fmt: skip
    print(r.stdout)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr[-3000:]
    assert js.returncode == 0, js.stdout + js.stderr[-3000:]
    assert json.loads(js.stdout) == {"text": "2", "count": 1, "stdout": ["from js\n"],
                                     "error": "NameError", "js": "42"}
