"""Round-trip latency of the agent as the SDK sees it: ``commands.run('true')`` and a 1 MiB
``files.write`` + ``files.read``, through the unmodified sync SDK.

Against any agent:  python -m tests.support.agent_bench --url http://IP:49983 [--token T]
Confined on the host (netns + unshare, as the tests run it):
                    python -m tests.support.agent_bench --confined
Prints p50/p90/min in milliseconds; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

N_DEFAULT = 50


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def measure(
    url: str, token: str | None, n: int, existing_token: str | None = None
) -> dict[str, dict[str, float]]:
    """Time ``n`` rounds. ``token`` is set through /init first; ``existing_token`` is one the
    agent already has (a node pushed it)."""
    import httpx
    from e2b import Sandbox

    from aenv.guest.agent.version import ENVD_VERSION
    from tests.support.e2b_stub import ControlPlaneStub

    if token:
        httpx.post(url + "/init", json={"accessToken": token}, timeout=10).raise_for_status()
    token = token or existing_token
    with ControlPlaneStub(envd_version=ENVD_VERSION, envd_token=token, api_key="bench") as stub:
        os.environ.update(E2B_API_URL=stub.url, E2B_SANDBOX_URL=url, E2B_API_KEY="bench")
        sbx = Sandbox.create()
        data = os.urandom(1024 * 1024)
        series: dict[str, list[float]] = {"run_true": [], "write_1mib": [], "read_1mib": []}
        for i in range(n + 3):  # the first runs warm connections and caches up
            t0 = time.perf_counter()
            sbx.commands.run("true")
            t1 = time.perf_counter()
            sbx.files.write("/tmp/aenv-bench.bin", data)
            t2 = time.perf_counter()
            got = sbx.files.read("/tmp/aenv-bench.bin", format="bytes")
            t3 = time.perf_counter()
            assert len(got) == len(data)
            if i >= 3:
                series["run_true"].append((t1 - t0) * 1000)
                series["write_1mib"].append((t2 - t1) * 1000)
                series["read_1mib"].append((t3 - t2) * 1000)
        sbx.kill()
    return {
        k: {
            "p50": round(statistics.median(v), 2),
            "p90": round(_pct(v, 90), 2),
            "min": round(min(v), 2),
        }
        for k, v in series.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--token")
    ap.add_argument("--n", type=int, default=N_DEFAULT)
    ap.add_argument("--confined", action="store_true")
    args = ap.parse_args()
    if args.confined:
        from tests.support.agent_ns import REPO, confined_agent

        with confined_agent() as agent:
            argv = agent.exec_argv(
                sys.executable, "-m", "tests.support.agent_bench", "--url", agent.url,
                "--token", "bench-token", "--n", str(args.n),
            )  # fmt: skip
            subprocess.run(argv, cwd=REPO, check=True)
        return
    print(json.dumps(measure(args.url, args.token, args.n), indent=1))


if __name__ == "__main__":
    main()
