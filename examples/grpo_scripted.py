"""A GRPO step loop with a scripted policy (no GPU, no model) on aenv's RL plane.

Each prompt is a small task: make ~/answer hold the sum of the numbers in ~/task. The task is
prepared once per prompt (the group's setup); every sample of the prompt is a fork of that
state, where the "policy" (a seeded random choice among candidate commands, some wrong) acts;
the reward is graded in a throwaway fork; advantages are normalised within each group.

    E2B_API_URL=http://127.0.0.1:8000 E2B_API_KEY=... python examples/grpo_scripted.py
    ... --cold     # the same with one cold sandbox per sample, for the wall time

Prints each step's rewards, advantages and wall time. Needs only `aenv-rl` (or `aenv`).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from e2b import Sandbox

from aenv.rl import RL, Setup

GRADER = ("mkdir -p /logs/verifier && "
          "if [ \"$(cat /home/user/answer 2>/dev/null)\" = \"$(cat /home/user/expected)\" ]; "
          "then echo 1; else echo 0; fi > /logs/verifier/reward.txt")  # fmt: skip


def task_setup(numbers: list[int]) -> Setup:
    return Setup(commands=[f"echo {' '.join(map(str, numbers))} > ~/task",
                           f"echo {sum(numbers)} > ~/expected"])  # fmt: skip


ACTIONS = [  # (command, whether it solves the task)
    ("python3 -c \"print(sum(map(int, open('/home/user/task').read().split())))\" > ~/answer",
     True),
    ("awk '{s=0; for(i=1;i<=NF;i++) s+=$i; print s}' ~/task > ~/answer", True),
    ("echo 0 > ~/answer", False),
]


def policy(rng: random.Random) -> tuple[str, bool]:
    """The scripted policy: right two times in three. Its command, and the reward due."""
    return rng.choice(ACTIONS)


def advantages(rewards: list[float]) -> list[float]:
    mean = statistics.fmean(rewards)
    sd = statistics.pstdev(rewards) or 1.0
    return [round((r - mean) / sd, 3) for r in rewards]


def grpo_step(rl: RL, step: int, prompts: int, group: int, at_once: int, seed: int,
              cold: bool) -> dict[str, list[tuple[float, float]]]:  # fmt: skip
    """One step: per prompt, each sample's (reward, the reward its action was due)."""
    rng = random.Random(seed + step)
    tasks = {f"step{step}-p{p}": [rng.randrange(100) for _ in range(4)] for p in range(prompts)}
    samples = [(key, random.Random(seed * 1000 + step * 100 + i))
               for i, key in enumerate(k for k in tasks for _ in range(group))]  # fmt: skip
    with rl.lease(120) as lease:
        def sample(item: tuple[str, random.Random]) -> tuple[float, float]:
            key, srng = item
            if cold:  # one cold sandbox per sample, its setup replayed
                sbx = Sandbox.create("base")
                lease.hold(sbx.sandbox_id)
                for cmd in task_setup(tasks[key]).commands:
                    sbx.commands.run(str(cmd))
            else:
                sbx = Sandbox.connect(lease.join(key, template="base",
                                                 setup=task_setup(tasks[key])).sandbox_id)
            cmd, right = policy(srng)
            sbx.commands.run(cmd)
            res = rl.evaluate(sbx.sandbox_id, GRADER)
            if res.status == "infra_error":
                raise RuntimeError(f"grading failed on the platform: {res.error}")
            sbx.kill()
            return float(res.reward or 0.0), float(right)

        by_prompt: dict[str, list[tuple[float, float]]] = {}
        with ThreadPoolExecutor(at_once) as pool:
            for (key, _), r in zip(samples, pool.map(sample, samples), strict=True):
                by_prompt.setdefault(key, []).append(r)
    return by_prompt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--at-once", type=int, default=8)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cold", action="store_true")
    args = ap.parse_args()
    wrong = 0
    t_all = time.monotonic()
    with RL() as rl:
        for step in range(args.steps):
            t0 = time.monotonic()
            groups = grpo_step(rl, step, args.prompts, args.group, args.at_once, args.seed,
                               args.cold)  # fmt: skip
            for key, got in groups.items():
                rewards = [r for r, _ in got]
                wrong += sum(r != due for r, due in got)
                print(f"step {step} {key}: rewards {rewards} advantages {advantages(rewards)}")
            print(f"step {step}: {time.monotonic() - t0:.1f} s "
                  f"({'cold sandboxes' if args.cold else 'groups'})", flush=True)
    print(f"total {time.monotonic() - t_all:.1f} s; rewards not as expected: {wrong}")
    raise SystemExit(1 if wrong else 0)


if __name__ == "__main__":
    main()
