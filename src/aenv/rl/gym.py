"""A Gymnasium environment over aenv sandboxes: `aenv.rl.GymEnv` (needs `gymnasium`).

An action is a shell command; the observation is what it printed. An episode starts in a new
member of the task's group (a fork of its start state: `key`, `template`, `setup`), ends when
the action is `submit_action` (terminated) or after `max_steps` (truncated); then the reward
is graded in a throwaway fork (`reward_cmd` writing `reward_file`). `clone(n)` branches the
environment: n environments, each in its own fork of the current state.

    env = GymEnv(key="task-17", template="base", setup=Setup(commands=["make"]),
                 reward_cmd="bash /tests/test.sh")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("ls")
"""

from __future__ import annotations

import secrets
import string
from typing import Any

import gymnasium
from gymnasium import spaces

from aenv.rl.client import RL, Lease, Setup, command_output

CHARSET = frozenset(string.printable)
MAX_OBSERVATION = 16384
MAX_ACTION = 4096


def _printable(text: str) -> str:
    return "".join(c if c in CHARSET else "?" for c in text)[-MAX_OBSERVATION:]


class GymEnv(gymnasium.Env[str, str]):
    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, rl: RL | None = None, *, key: str | None = None,
                 template: str = "base", setup: Setup | None = None,
                 reward_cmd: str | None = None,
                 reward_file: str = "/logs/verifier/reward.txt",
                 submit_action: str = "submit", max_steps: int = 32,
                 command_timeout: float = 120, lease_s: float = 300,
                 lease: Lease | None = None) -> None:  # fmt: skip
        self.rl = rl or RL()
        self.key = key or "gym-" + secrets.token_hex(6)
        self.template = template
        self.setup = setup
        self.reward_cmd = reward_cmd
        self.reward_file = reward_file
        self.submit_action = submit_action
        self.max_steps = max_steps
        self.command_timeout = command_timeout
        self._own_lease = lease is None
        self.lease = lease or self.rl.lease(lease_s)
        self.observation_space = spaces.Text(max_length=MAX_OBSERVATION, min_length=0,
                                             charset="".join(sorted(CHARSET)))  # fmt: skip
        self.action_space = spaces.Text(max_length=MAX_ACTION, min_length=1)
        self.sandbox: Any = None  # the episode's e2b.Sandbox
        self.steps = 0
        self._start_from: str | None = None  # a clone's: the checkpoint it starts from

    # -- gymnasium -------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None,
              ) -> tuple[str, dict[str, Any]]:  # fmt: skip
        super().reset(seed=seed)
        self._end_episode()
        if self._start_from is not None:
            (sid,) = self.rl.fork_checkpoint(self._start_from, 1, lease=self.lease)
        else:
            sid = self.lease.join(self.key, template=self.template, setup=self.setup).sandbox_id
        from e2b import Sandbox

        self.sandbox = Sandbox.connect(sid, api_key=self.rl.api_key, api_url=self.rl.api_url)
        self.steps = 0
        return "", {"sandbox_id": sid}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.sandbox is None:
            raise RuntimeError("call reset() before step()")
        self.steps += 1
        info: dict[str, Any] = {}  # the same for the same action (check_env): no ids
        if action.strip() == self.submit_action:
            return "", self._grade(info), True, False, info
        out, info["exit_code"] = self._run(action)
        truncated = self.steps >= self.max_steps
        reward = self._grade(info) if truncated else 0.0
        return _printable(out), reward, False, truncated, info

    def close(self) -> None:
        self._end_episode()
        if self._own_lease:
            self.lease.close()
        super().close()

    # -- aenv ------------------------------------------------------------------------------

    def clone(self, n: int) -> list[GymEnv]:
        """n environments, each continuing from this one's current state in a fork of its
        own (under this one's lease); a reset() of a clone starts from that state again."""
        if self.sandbox is None:
            raise RuntimeError("call reset() before clone()")
        step = self.rl.checkpoint(self.sandbox.sandbox_id, lease=self.lease)
        from e2b import Sandbox

        out = []
        for sid in self.rl.fork_checkpoint(step, n, lease=self.lease):
            env = GymEnv(self.rl, key=self.key, template=self.template, setup=self.setup,
                         reward_cmd=self.reward_cmd, reward_file=self.reward_file,
                         submit_action=self.submit_action, max_steps=self.max_steps,
                         command_timeout=self.command_timeout, lease=self.lease)  # fmt: skip
            env.sandbox = Sandbox.connect(sid, api_key=self.rl.api_key, api_url=self.rl.api_url)
            env.steps, env._start_from = self.steps, step
            out.append(env)
        return out

    def _run(self, cmd: str) -> tuple[str, int]:
        return command_output(self.sandbox, cmd, self.command_timeout)

    def _grade(self, info: dict[str, Any]) -> float:
        if self.reward_cmd is None:
            return 0.0
        reward, res = self.rl.reward(self.sandbox.sandbox_id, self.reward_cmd,
                                     reward_file=self.reward_file)  # fmt: skip
        info["reward_status"] = res.status
        if res.error:
            info["reward_error"] = res.error
        return reward

    def _end_episode(self) -> None:
        if self.sandbox is not None:
            try:
                self.sandbox.kill()
            finally:
                self.sandbox = None
