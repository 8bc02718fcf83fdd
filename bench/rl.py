"""The RL plane against one cold sandbox per sample (issue 32): a GRPO step of 4 prompts x 8
samples, and reward in a throwaway fork.

Run as root after `make setup`:  .venv/bin/python bench/rl.py [--fixtures light,heavy]

- step: 32 samples, at most 8 at once on both paths, in one run. Each sample runs one step
  command and one reward command, then its sandbox is killed.
  - group path: each sample calls `lease.join(<its prompt's key>, setup=...)` (aenv.rl),
    samples of the 4 prompts interleaved (a trainer's batch): 4 start states made (their
    setups side by side), 32 members forked on demand. `aenv_rl_ops_total` counts both.
  - cold path: `Sandbox.create("base")` and the setup replayed in it, per sample.
  Fixtures: light (three 256 KiB files under ~/w, a background counter, an exported
  variable); heavy (that, plus a virtual environment with pip installed from the wheel
  Python bundles: ~30 s of guest work under TCG).
- evaluate: `POST /rl/evaluate` (wall time minus the command's own) against a fork of the
  same sandbox with a first command in it (`POST /sandboxes/{id}/fork`, connect, run, kill).
p50 of `--evals` runs each, alternated.

Nothing is asserted: targets live in the issue (the step <= 1/5 of the cold path with the
heavy fixture; evaluate <= 1.5x a fork plus a first command).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from node import Node  # bench/node.py

from aenv.rl import RL, Background, Setup

TEMPLATE = "base"
PROMPTS, SAMPLES, AT_ONCE = 4, 8, 8
LIGHT = [
    "mkdir -p ~/w && for i in 1 2 3; do head -c 262144 /dev/urandom > ~/w/f$i; done",
    "echo 'export RLVAR=set' > ~/w/env.sh",
    Background("i=0; while :; do i=$((i+1)); echo $i > /tmp/c.n; mv /tmp/c.n /tmp/c; "
               "sleep 0.2; done"),
]
FIXTURES = {"light": LIGHT, "heavy": [*LIGHT, "python3 -m venv ~/venv"]}
STEP = ". ~/w/env.sh && echo \"$RLVAR $(cat /tmp/c)\" >> ~/w/trajectory"
REWARD = "test -s ~/w/trajectory && echo 1 || echo 0"


def _rl_ops(node: Node) -> dict[str, float]:
    text = httpx.get(node.origin + "/metrics", headers={"X-API-Key": node.key}).text
    return {f"{m[1]}/{m[2]}": float(m[3]) for m in re.finditer(
        r'^aenv_rl_ops_total\{op="(\w+)",outcome="(\w+)"\} ([0-9.e+]+)$', text, re.M)}


def _sample(sbx: object) -> float:
    run = sbx.commands.run  # type: ignore[attr-defined]
    run(STEP)
    reward = float(run(REWARD).stdout)
    sbx.kill()  # type: ignore[attr-defined]
    return reward


def group_path(rl: RL, tag: str, steps: list[str | Background]) -> tuple[float, list[float]]:
    t0 = time.monotonic()
    with rl.lease(120) as lease:
        def one(i: int) -> float:
            # Samples arrive prompt after prompt, as a trainer's batch does; no member is
            # forked ahead (n=0), so at most AT_ONCE sandboxes run at once here too.
            m = lease.join(f"{tag}-p{i % PROMPTS}", template=TEMPLATE,
                           setup=Setup(commands=steps))  # fmt: skip
            return _sample(m.sandbox())

        with ThreadPoolExecutor(AT_ONCE) as pool:
            rewards = list(pool.map(one, range(PROMPTS * SAMPLES)))
    return time.monotonic() - t0, rewards


def cold_path(steps: list[str | Background]) -> tuple[float, list[float]]:
    from e2b import Sandbox

    def one(_: int) -> float:
        sbx = Sandbox.create(TEMPLATE, timeout=900)
        try:
            for s in steps:
                if isinstance(s, Background):
                    sbx.commands.run(s.cmd, background=True)
                else:
                    sbx.commands.run(s, timeout=900)
            return _sample(sbx)
        except BaseException:
            sbx.kill()
            raise

    t0 = time.monotonic()
    with ThreadPoolExecutor(AT_ONCE) as pool:
        rewards = list(pool.map(one, range(PROMPTS * SAMPLES)))
    return time.monotonic() - t0, rewards


def evaluate_vs_fork(node: Node, rl: RL, runs: int) -> tuple[list[float], list[float]]:
    from e2b import Sandbox

    src = Sandbox.create(TEMPLATE, timeout=900)
    evals, forks = [], []
    try:
        for s in LIGHT:
            if isinstance(s, Background):
                src.commands.run(s.cmd, background=True)
            else:
                src.commands.run(s)
        cmd = "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt"
        with node.api() as c:
            for _ in range(runs):
                res = rl.evaluate(src.sandbox_id, cmd)
                assert res.status == "ok", res
                evals.append((res.duration_ms - res.raw["commandMs"]) / 1000)
                t0 = time.monotonic()
                r = c.post(f"/sandboxes/{src.sandbox_id}/fork", json={"count": 1})
                assert r.status_code == 201, r.text
                kid = Sandbox.connect(r.json()[0]["sandbox"]["sandboxID"])
                kid.commands.run(cmd, user="root")
                forks.append(time.monotonic() - t0)
                kid.kill()
    finally:
        src.kill()
    return evals, forks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixtures", default="light,heavy")
    ap.add_argument("--evals", type=int, default=5)
    args = ap.parse_args()
    log = Path(tempfile.mkdtemp(prefix="aenv-bench-rl-")) / "server.log"
    node = Node(log, AENV_PRIMED_POOL_SIZE="0")
    node.start()
    os.environ.update({"E2B_API_URL": node.origin, "E2B_SANDBOX_URL": node.origin,
                       "E2B_API_KEY": node.key})  # fmt: skip
    rows = []
    try:
        with RL(node.origin, node.key) as rl:
            for name in args.fixtures.split(","):
                steps = FIXTURES[name]
                before = _rl_ops(node)
                g_s, g_r = group_path(rl, f"bench-{name}-{os.urandom(3).hex()}", steps)
                after = _rl_ops(node)
                c_s, c_r = cold_path(steps)
                made = {k: after.get(k, 0) - before.get(k, 0) for k in ("setup/ok", "member/ok")}
                rows.append((name, g_s, c_s, made, sum(g_r), sum(c_r)))
            evals, forks = evaluate_vs_fork(node, rl, args.evals)
    finally:
        node.stop()
    print(f"\nGRPO step: {PROMPTS} prompts x {SAMPLES} samples, at most {AT_ONCE} at once, "
          f"`{TEMPLATE}`, TCG\n")
    print("| fixture | group path | cold path | group / cold | setups | forks | rewards "
          "(group, cold) |")
    print("|---|---|---|---|---|---|---|")
    for name, g_s, c_s, made, gr, cr in rows:
        print(f"| {name} | {g_s:.1f} s | {c_s:.1f} s | {g_s / c_s:.2f} (1/{c_s / g_s:.1f}) | "
              f"{made['setup/ok']:.0f} | {made['member/ok']:.0f} | {gr:.0f}, {cr:.0f} |")
    e, f = statistics.median(evals), statistics.median(forks)
    print(f"\nevaluate ({args.evals} runs, p50): evaluate minus its command {e * 1000:.0f} ms; "
          f"fork + first command {f * 1000:.0f} ms; ratio {e / f:.2f}\n")
    print(f"node log: {log}")


if __name__ == "__main__":
    main()
