"""verl on aenv (verl 0.9.1): a tool whose sandbox lives for a whole trajectory, and an agent
loop whose samples are members of their prompt's group, graded in a throwaway fork. (verl's
reward through SandboxFusion needs no code: `POST /rl/run_code/{token}`, docs/rl.md.)

The tool, in `actor_rollout_ref.rollout.multi_turn.tool_config_path`:

    tools:
      - class_name: aenv.integrations.verl.AenvTool
        config: {type: native, template: base, idle_s: 600}

verl's ToolAgentLoop creates and releases a tool instance around every call, so the tool
keys its sandbox on the trajectory (`agent_data.request_id`), not on the instance: the first
call of a trajectory joins the group of `create_kwargs.group` (a dataset row's
`extra_info.tools_kwargs.aenv.create_kwargs`; default: the trajectory's own), later calls
reuse its sandbox, `release` leaves it running. A trajectory's sandbox ends when it has been
idle `idle_s`, or with the process's lease (a trainer that dies leaves none).

The agent loop, by name (`agent_name: aenv_agent` in a row; the module imported in the
workers, e.g. through `rollout.agent.agent_loop_config_path`):

    {"agent_name": "aenv_agent", "extra_info": {"aenv": {"template": "base",
     "setup": ["pip install -e ."], "reward_cmd": "bash /tests/test.sh"}}, ...}

joins the group of the row's `uid` (verl gives the n rollouts of a prompt one uid): they
start from one prepared state. The model's `<bash>...</bash>` commands run there, their
output comes back as the next turn; the reward is graded in a throwaway fork
(`reward_score`); a platform failure raises, never scoring 0.

verl imports torch: this module is tested against verl 0.9.1's signatures, pinned in
tests/e2e/test_rl_verl.py, not against the package."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopOutput,
    register,
)
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from aenv.rl.client import Setup, command_of, command_output, process_lease

TOOL_NAME = "bash"
AGENT_NAME = "aenv_agent"
MAX_OUTPUT = 16384
SCHEMA = {"type": "function", "function": {
    "name": TOOL_NAME, "description": "Run a shell command in the task's sandbox.",
    "parameters": {"type": "object", "required": ["command"], "properties": {
        "command": {"type": "string", "description": "the command, for bash -c"}}}}}


def _join(key: str, cfg: dict[str, Any]) -> str:
    setup = Setup(commands=list(cfg.get("setup") or []))
    member = process_lease().join(key, template=cfg.get("template"), image=cfg.get("image"),
                                  setup=setup if setup.commands else None)  # fmt: skip
    return member.sandbox_id


def _connect(sandbox_id: str) -> Any:
    from e2b import Sandbox

    rl = process_lease().rl
    return Sandbox.connect(sandbox_id, api_key=rl.api_key, api_url=rl.api_url)


class AenvTool(BaseTool):
    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None):
        super().__init__(config, tool_schema or OpenAIFunctionToolSchema.model_validate(SCHEMA))
        self.idle_s = float(config.get("idle_s", 600))
        self.timeout = float(config.get("command_timeout", 120))
        self.source = {"image": config["image"]} if config.get("image") else {
            "template": config.get("template", "base")}
        self.setup = list(config.get("setup") or [])
        self._groups: dict[str, str] = {}  # instance id -> the group its create named
        # trajectory -> its sandbox (being joined, or joined), and when it was last used
        self._sandboxes: dict[str, asyncio.Future[Any]] = {}
        self._used: dict[str, float] = {}

    async def create(self, instance_id: str | None = None, **kwargs: Any,
                     ) -> tuple[str, ToolResponse]:  # fmt: skip
        instance_id, response = await super().create(instance_id, **kwargs)
        group = (kwargs.get("create_kwargs") or {}).get("group")
        if group:
            self._groups[instance_id] = str(group)
        return instance_id, response

    async def execute(self, instance_id: str, parameters: dict[str, Any],
                      **kwargs: Any) -> tuple[ToolResponse, float, dict[str, Any]]:  # fmt: skip
        agent_data = kwargs.get("agent_data")
        trajectory = str(getattr(agent_data, "request_id", None) or instance_id)
        command = str(parameters.get("command") or "").strip()
        if not command:
            return ToolResponse(text="no command given"), 0.0, {}
        sbx = await self._sandbox(trajectory, self._groups.get(instance_id, trajectory))
        out, code = await asyncio.to_thread(command_output, sbx, command, self.timeout)
        self._used[trajectory] = time.monotonic()
        return ToolResponse(text=out[-MAX_OUTPUT:]), 0.0, {"exit_code": code}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        # verl releases after every call: the trajectory's sandbox stays (idle_s, lease).
        self._groups.pop(instance_id, None)

    async def end(self, trajectory: str) -> None:
        """End a trajectory's sandbox now (an agent loop that knows it is done)."""
        self._used.pop(trajectory, None)
        fut = self._sandboxes.pop(trajectory, None)
        if fut is not None and fut.done() and fut.exception() is None:
            await asyncio.to_thread(fut.result().kill)

    async def _sandbox(self, trajectory: str, group: str) -> Any:
        now = time.monotonic()
        for t in [t for t, used in self._used.items()
                  if now - used > self.idle_s and t != trajectory]:  # fmt: skip
            await self.end(t)
        fut = self._sandboxes.get(trajectory)
        if fut is None:  # the trajectory's first call: concurrent ones wait on it
            fut = asyncio.ensure_future(asyncio.to_thread(self._open, group))
            self._sandboxes[trajectory] = fut
        self._used[trajectory] = now
        try:
            return await asyncio.shield(fut)
        except BaseException:
            if self._sandboxes.get(trajectory) is fut and fut.done():
                del self._sandboxes[trajectory]  # the next call tries again
            raise

    def _open(self, group: str) -> Any:
        return _connect(_join(group, {**self.source, "setup": self.setup}))


@register(AGENT_NAME)
class AenvAgentLoop(AgentLoopBase):
    """Turns of model text and command output in a member of the prompt's group."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        cfg = dict((kwargs.get("extra_info") or {}).get("aenv") or {})
        if not cfg.get("reward_cmd"):
            raise ValueError("extra_info.aenv.reward_cmd is required: how to grade")
        rollout = self.config.actor_rollout_ref.rollout
        max_turns = int(cfg.get("max_turns", 8))
        response_length = int(rollout.response_length)
        sid = await asyncio.to_thread(_join, str(kwargs["uid"]), cfg)
        sbx = await asyncio.to_thread(_connect, sid)
        try:
            prompt_ids = await asyncio.to_thread(
                self.tokenizer.apply_chat_template, list(kwargs["raw_prompt"]),
                add_generation_prompt=True, tokenize=True)  # fmt: skip
            response_ids: list[int] = []
            mask: list[int] = []
            turns = 0
            request_id = uuid4().hex  # the model server's sticky-session key
            while turns < max_turns and len(response_ids) < response_length:
                turns += 1
                out = await self.server_manager.generate(
                    request_id=request_id, prompt_ids=prompt_ids + response_ids,
                    sampling_params=sampling_params)  # fmt: skip
                response_ids += out.token_ids
                mask += [1] * len(out.token_ids)
                cmd = command_of(self.tokenizer.decode(out.token_ids))
                if cmd is None:
                    break
                text, code = await asyncio.to_thread(command_output, sbx, cmd,
                                                     float(cfg.get("command_timeout", 120)))
                obs = self.tokenizer.encode(f"\n<output exit_code=\"{code}\">\n"
                                            f"{text[-MAX_OUTPUT:]}</output>\n",
                                            add_special_tokens=False)  # fmt: skip
                response_ids += obs
                mask += [0] * len(obs)
            rl = process_lease().rl
            reward, res = await asyncio.to_thread(
                rl.reward, sid, str(cfg["reward_cmd"]),
                reward_file=str(cfg.get("reward_file", "/logs/verifier/reward.txt")))
        finally:
            await asyncio.to_thread(sbx.kill)
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=response_ids[:response_length],
            response_mask=mask[:response_length], reward_score=reward, num_turns=turns,
            metrics={}, extra_fields={"aenv_sandbox_id": sid, "aenv_reward_status": res.status})
