"""SkyRL's environment on aenv: one task's samples as episodes in forks of its start state,
driven here by a scripted "model" as SkyRLGymGenerator.agent_loop drives it (skyrl 0.3.0):
the generator hook, `skyrl_gym.make(env_class, env_config, extras)`, init, step, close.

    E2B_API_URL=http://127.0.0.1:8000 E2B_API_KEY=... python examples/skyrl_env.py

Needs `aenv-rl[skyrl]` (skyrl-gym 0.4.0). In a real run, `register()` goes in the trainer's
entry point and `setup_env_extras` in a SkyRLGymGenerator subclass (docs/rl.md)."""

from __future__ import annotations

import dataclasses
import json

import skyrl_gym

import aenv.integrations.skyrl as aenv_skyrl

GRADE = ("mkdir -p /logs/verifier && r=0 && [ \"$(cat /home/user/answer)\" = 6 ] && r=1; "
         "echo $r > /logs/verifier/reward.txt")  # fmt: skip
ROW = {"uid": "sum-1-2-3", "max_turns": 4,
       "aenv": {"template": "base", "setup": ["echo 1 2 3 > ~/task"], "reward_cmd": GRADE}}
POLICY = [  # what the "model" says, one list per sample
    ["<bash>cat ~/task</bash>", "<bash>echo 6 > ~/answer</bash>", "<submit/>"],
    ["<bash>echo 5 > ~/answer</bash>", "<submit/>"],
    ["The answer is six."],
]


@dataclasses.dataclass
class TrajectoryID:  # skyrl.train.generators.base.TrajectoryID (skyrl 0.3.0)
    instance_id: str
    repetition_id: int


def main() -> None:
    aenv_skyrl.register()
    rewards = []
    for rep, actions in enumerate(POLICY):
        extras = aenv_skyrl.setup_env_extras("aenv", dict(ROW), None,
                                             TrajectoryID(ROW["uid"], rep))  # fmt: skip
        env = skyrl_gym.make("aenv", env_config={}, extras=extras)
        env.init([{"role": "user", "content": "Write the sum of ~/task to ~/answer."}])
        try:
            for action in actions:
                out = env.step(action)
                if out["done"]:
                    rewards.append(out["reward"])
                    break
        finally:
            env.close()
    print(json.dumps({"rewards": rewards}))


if __name__ == "__main__":
    main()
