"""Long streams (issue 31): a command that prints a line every 10 s streams to its end with
no idle timeout and no reset. CI: 60 s straight to a node. `make test-long`: 30 minutes, at
once through the node, through haproxy and a gateway over plain HTTP, and over TLS as a
production client reaches a cluster (test_gateway.tls_front)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from .conftest import API_KEY, NodeProcess
from .test_gateway import REPO, Cluster, cluster, tls_front  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]
EVERY_S = 10
STREAM = """
import sys, time
from e2b import Sandbox
lines = int(sys.argv[1])
sbx = Sandbox.create("base-minimal", timeout=lines * 10 + 300)
got = []
try:
    r = sbx.commands.run(f"for i in $(seq {lines}); do echo line $i; sleep 10; done",
                         timeout=0, on_stdout=lambda s: got.append((time.monotonic(), s)))
finally:
    sbx.kill()
assert r.exit_code == 0 and r.stdout.split("\\n")[:-1] == [f"line {i}" for i in
    range(1, lines + 1)], r
gaps = [b[0] - a[0] for a, b in zip(got, got[1:])]
print("streamed", len(got), "lines; longest gap", round(max(gaps or [0]), 1), "s")
"""


def _stream(origin: str, lines: int) -> str:
    env = {**os.environ, "E2B_API_URL": origin, "E2B_SANDBOX_URL": origin,
           "E2B_API_KEY": API_KEY, "PYTHONPATH": str(REPO)}  # fmt: skip
    r = subprocess.run([sys.executable, "-c", STREAM, str(lines)], env=env, text=True,
                       capture_output=True, timeout=lines * EVERY_S + 600)  # fmt: skip
    assert r.returncode == 0 and "streamed" in r.stdout, r.stdout + r.stderr[-3000:]
    return r.stdout.strip()


def test_a_60_s_stream_to_its_end(node: NodeProcess) -> None:
    t0 = time.monotonic()
    print(_stream(node.origin, 6), f"in {time.monotonic() - t0:.0f} s")


@pytest.mark.long
def test_a_30_minute_stream_through_node_gateway_and_tls(cluster: Cluster,  # noqa: F811
                                                         tmp_path: Path) -> None:
    lines = 30 * 60 // EVERY_S
    with tls_front(cluster, tmp_path) as (ns, env), ThreadPoolExecutor(3) as pool:
        direct = pool.submit(_stream, cluster.nodes[0].origin, lines)
        gateway = pool.submit(_stream, cluster.gateway.origin, lines)

        def over_tls() -> str:
            r = ns.run([sys.executable, "-c", STREAM, str(lines)], env,
                       timeout=lines * EVERY_S + 600, cwd=REPO)  # fmt: skip
            assert r.returncode == 0 and "streamed" in r.stdout, r.stdout + r.stderr[-3000:]
            return r.stdout.strip()

        tls = pool.submit(over_tls)
        for what, f in (("node", direct), ("gateway", gateway), ("tls", tls)):
            print(what, f.result())
