"""SkyRL on aenv (skyrl-gym 0.4.0, skyrl 0.3.0): a text environment whose episodes run in
members of a group, one start state per task, and the generator hook that joins it.

    import aenv.integrations.skyrl as aenv_skyrl
    aenv_skyrl.register()                       # env id "aenv" (in every Ray worker)

A dataset row's columns become the environment's `extras`; aenv's go under `aenv`:

    {"aenv": {"template": "base", "setup": ["pip install -e ."],
              "reward_cmd": "bash /tests/test.sh"}, "uid": "task-17", ...}

An action is the model's text: the command in its last <bash>...</bash> (or ```bash fence)
runs in the sandbox and what it printed is the next observation; an action with no command,
or <submit/>, ends the episode, as does `max_turns`. The reward is then graded in a
throwaway fork (`reward_cmd` writing `reward_file`): a platform failure raises, it is never
scored 0.

The group key is the task's: `aenv.key`, else the generator's trajectory instance id (with
the hook below), else the row's `uid` or `instance_id`. SkyRL's generator does not hand the
trajectory id to environments; its hook `_setup_env_extras` does (skyrl 0.3.0, in
skyrl/train/generators/skyrl_gym_generator.py, which imports torch):

    class Generator(SkyRLGymGenerator):
        def _setup_env_extras(self, env_class, env_extras, sampling_params, trajectory_id):
            return aenv_skyrl.setup_env_extras(env_class, env_extras, sampling_params,
                                               trajectory_id)

which joins the group there and hands the member to the environment. The batched path of
the generator (`generate_batched`) calls no hook: the environment joins itself.
"""

from __future__ import annotations

from typing import Any

from skyrl_gym import register as _register
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from aenv.rl.client import Setup, command_of, command_output, process_lease

ENV_ID = "aenv"
KEY_EXTRA = "aenv_key"  # set by the hook: the trajectory's instance id
SANDBOX_EXTRA = "aenv_sandbox_id"  # set by the hook: the member joined for it
MAX_OBSERVATION = 16384


def register() -> None:
    """Register the environment as `aenv` (once per process; again is a no-op)."""
    from skyrl_gym.envs.registration import registry

    if ENV_ID not in registry:
        _register(id=ENV_ID, entry_point="aenv.integrations.skyrl:AenvTextEnv")


def _join(extras: dict[str, Any], key: str) -> str:
    cfg = extras.get("aenv") or {}
    setup = Setup(commands=list(cfg.get("setup") or []))
    member = process_lease().join(key, template=cfg.get("template"), image=cfg.get("image"),
                                  setup=setup if setup.commands else None)  # fmt: skip
    return member.sandbox_id


def setup_env_extras(env_class: str, env_extras: dict[str, Any],
                     sampling_params: dict[str, Any] | None,
                     trajectory_id: Any) -> dict[str, Any]:  # fmt: skip
    """SkyRL's `_setup_env_extras` for `aenv` environments: the trajectory's instance id is
    the group key (its samples share a start state), and its member is joined here."""
    if env_class != ENV_ID or trajectory_id is None:
        return env_extras
    key = (env_extras.get("aenv") or {}).get("key") or str(trajectory_id.instance_id)
    return {**env_extras, KEY_EXTRA: key, SANDBOX_EXTRA: _join(env_extras, key)}


class AenvTextEnv(BaseTextEnv):
    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.extras = dict(extras or {})
        cfg = self.extras.get("aenv") or {}
        if not cfg.get("reward_cmd"):
            raise ValueError("extras['aenv']['reward_cmd'] is required: how to grade")
        if not (cfg.get("template") or cfg.get("image")):
            raise ValueError("extras['aenv'] needs a template or an image")
        self.key = str(cfg.get("key") or self.extras.get(KEY_EXTRA) or self.extras.get("uid")
                       or self.extras.get("instance_id") or "")  # fmt: skip
        if not self.key:
            raise ValueError("no group key: give extras['aenv']['key'], a uid column, or "
                             "the generator hook (setup_env_extras)")  # fmt: skip
        self.reward_cmd = str(cfg["reward_cmd"])
        self.reward_file = str(cfg.get("reward_file", "/logs/verifier/reward.txt"))
        self.timeout = float(cfg.get("command_timeout", 120))
        self.max_turns = int(self.extras.get("max_turns", cfg.get("max_turns", 8)))
        self.sandbox: Any = None
        self.reward: float | None = None

    def init(self, prompt: list[dict[str, str]]) -> tuple[list[dict[str, str]], dict[str, Any]]:
        from e2b import Sandbox

        sid = self.extras.get(SANDBOX_EXTRA) or _join(self.extras, self.key)
        rl = process_lease().rl
        self.sandbox = Sandbox.connect(sid, api_key=rl.api_key, api_url=rl.api_url)
        return prompt, {"sandbox_id": sid}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.sandbox is None:
            raise RuntimeError("init() first")
        self.turns += 1
        cmd = command_of(action)
        if cmd is not None:
            out, code = command_output(self.sandbox, cmd, self.timeout)
            if self.turns < self.max_turns:
                return BaseTextEnvStepOutput(
                    observations=[{"role": "user", "content": out[-MAX_OBSERVATION:]}],
                    reward=0.0, done=False, metadata={"exit_code": code},
                    postprocessed_action=None)  # fmt: skip
        rl = process_lease().rl
        self.reward, res = rl.reward(self.sandbox.sandbox_id, self.reward_cmd,
                                     reward_file=self.reward_file)  # fmt: skip
        return BaseTextEnvStepOutput(observations=[], reward=self.reward, done=True,
                                     metadata={"reward_status": res.status},
                                     postprocessed_action=None)  # fmt: skip

    def get_metrics(self) -> dict[str, Any]:
        return {"turns": self.turns, "reward": self.reward if self.reward is not None else 0.0}

    def close(self) -> None:
        if self.sandbox is not None:
            try:
                self.sandbox.kill()
            finally:
                self.sandbox = None
