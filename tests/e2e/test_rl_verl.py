"""verl's paths on a real node (issue 32): aenv's tool and agent loop, driven as verl 0.9.1
drives them. verl imports torch, so its parts these touch are pinned here, signature for
signature, from the verl 0.9.1 wheel (sha256 db6e6f2a…bfdd14): `verl/tools/base_tool.py`,
`verl/tools/schemas.py`, `verl/experimental/agent_loop/agent_loop.py` (register,
AgentLoopBase.__init__, AgentLoopOutput) and ToolAgentLoop._call_tool's sequence (create with
`create_kwargs` only, execute with `agent_data`, release in `finally`, a new instance per
call). The SandboxFusion reward: tests/e2e/test_rl_run_code.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from .conftest import NodeProcess
from .test_rl import _delta, _rl_ops, _sandboxes
from .test_rl_adapters import _run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

VERL_0_9_1 = {
    "verl/__init__.py": "",
    "verl/tools/__init__.py": "",
    "verl/tools/schemas.py": '''
        from typing import Any
        from pydantic import BaseModel, Field, model_validator

        class OpenAIFunctionPropertySchema(BaseModel):
            type: str | list[str]
            description: str | None = None
            enum: list[Any] | None = None

        class OpenAIFunctionParametersSchema(BaseModel):
            type: str
            properties: dict[str, OpenAIFunctionPropertySchema]
            required: list[str] = Field(default_factory=list)

        class OpenAIFunctionSchema(BaseModel):
            name: str
            description: str
            parameters: OpenAIFunctionParametersSchema = Field(
                default_factory=lambda: OpenAIFunctionParametersSchema(
                    type="object", properties={}, required=[]))
            strict: bool = False

        class OpenAIFunctionToolSchema(BaseModel):
            type: str
            function: OpenAIFunctionSchema

        class ToolResponse(BaseModel):
            text: str | None = None
            image: list[Any] | None = None
            video: list[Any] | None = None

            @model_validator(mode="before")
            @classmethod
            def initialize_request(cls, values):
                for k in ("image", "video"):
                    if k in values and not isinstance(values[k], list):
                        raise ValueError(f"{k} must be a list")
                return values
    ''',
    "verl/tools/base_tool.py": '''
        import json
        from typing import Any, Optional
        from uuid import uuid4
        from .schemas import OpenAIFunctionToolSchema, ToolResponse

        class BaseTool:
            def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema):
                self.config = config
                self.tool_schema = tool_schema or self.get_openai_tool_schema()
                assert self.tool_schema is not None, "Tool schema is not set!"
                self.name = self.tool_schema.function.name

            def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
                return self.tool_schema

            async def create(self, instance_id: Optional[str] = None, **kwargs
                             ) -> tuple[str, ToolResponse]:
                if instance_id is None:
                    return str(uuid4()), ToolResponse()
                return instance_id, ToolResponse()

            async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs
                              ) -> tuple[ToolResponse, float, dict]:
                return ToolResponse(text="Updated the tool state."), 0.0, {}

            async def calc_reward(self, instance_id: str, **kwargs) -> float:
                return 0.0

            async def release(self, instance_id: str, **kwargs) -> None:
                pass
    ''',
    "verl/experimental/__init__.py": "",
    "verl/experimental/agent_loop/__init__.py": "",
    "verl/experimental/agent_loop/agent_loop.py": '''
        from abc import ABC, abstractmethod
        from typing import Any, Optional
        from pydantic import BaseModel

        _agent_loop_registry: dict[str, dict] = {}

        def register(agent_name: str):
            def decorator(subclass):
                fqdn = f"{subclass.__module__}.{subclass.__qualname__}"
                _agent_loop_registry[agent_name] = {"_target_": fqdn}
                return subclass
            return decorator

        class DictConfigWrap:
            def __init__(self, config):
                self.config = config

        class AgentLoopMetrics(BaseModel):
            generate_sequences: float = 0.0
            tool_calls: float = 0.0
            compute_score: float = 0.0
            num_preempted: int = -1

        class AgentLoopOutput(BaseModel):
            prompt_ids: list[int]
            response_ids: list[int]
            response_mask: list[int]
            response_logprobs: Optional[list[float]] = None
            routed_experts: Optional[Any] = None
            multi_modal_data: Optional[dict[str, Any]] = None
            reward_score: Optional[float] = None
            num_turns: int = 0
            metrics: AgentLoopMetrics
            extra_fields: dict[str, Any] = {}
            mm_processor_kwargs: Optional[dict[str, Any]] = None
            mm_processor_output: Optional[list[dict[str, Any]]] = None

        class AgentLoopBase(ABC):
            def __init__(self, trainer_config, server_manager, tokenizer, processor,
                         dataset_cls, data_config, hf_model_type: str | None = None,
                         **kwargs):
                self.config = trainer_config.config
                self.rollout_config = self.config.actor_rollout_ref.rollout
                self.server_manager = server_manager
                self.tokenizer = tokenizer
                self.processor = processor
                self.dataset_cls = dataset_cls
                self.data_config = data_config.config

            @abstractmethod
            async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
                raise NotImplementedError
    ''',
}

DRIVE = """
    import asyncio, importlib, json, time
    from types import SimpleNamespace as NS
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry, DictConfigWrap
    import aenv.integrations.verl as aenv_verl

    async def call_tool(tool, tools_kwargs, agent_data, args):
        # ToolAgentLoop._call_tool, verl 0.9.1 (BaseTool branch)
        instance_id = None
        try:
            kwargs = tools_kwargs.get(tool.name, {})
            instance_id, _ = await tool.create(create_kwargs=kwargs.get("create_kwargs", {}))
            resp, reward, res = await tool.execute(instance_id, args, agent_data=agent_data)
        finally:
            if instance_id:
                await tool.release(instance_id)
        return resp.text, reward, res

    class Tokenizer:  # a character per token
        def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
            return [ord(c) for c in "".join(m["content"] for m in messages) + "\\n"]
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]
        def decode(self, ids):
            return "".join(map(chr, ids))

    class Server:  # a scripted policy: the next reply of each trajectory
        def __init__(self, script):
            self.script, self.seen = script, {}
        async def generate(self, request_id, *, prompt_ids, sampling_params, **kw):
            i = self.seen.setdefault(request_id, len(self.seen))
            replies = self.script[i]
            text = replies.pop(0) if replies else "done"
            return NS(token_ids=[ord(c) for c in text], log_probs=None)

    async def main():
        out = {}
        tool = aenv_verl.AenvTool({"type": "native", "template": "base", "idle_s": 6,
                                   "setup": ["echo start > ~/s"]}, None)
        out["schema"] = tool.name
        kw = {"bash": {"create_kwargs": {"group": "verl-task-1"}}}
        a, b = NS(request_id="traj-a"), NS(request_id="traj-b")
        r1 = await call_tool(tool, kw, a, {"command": "cat ~/s && echo a > ~/mine"})
        r2 = await call_tool(tool, kw, b, {"command": "cat ~/mine 2>/dev/null || echo none"})
        r3 = await call_tool(tool, kw, a, {"command": "cat ~/mine"})
        r4 = await call_tool(tool, kw, a, {"command": "exit 4"})
        out["tool"] = [r1[0], r2[0], r3[0], r4[2]]
        time.sleep(6.5)  # both idle past idle_s: a new trajectory's call ends them
        await call_tool(tool, kw, NS(request_id="traj-c"), {"command": "true"})
        out["after_idle"] = sorted(tool._sandboxes)
        await tool.end("traj-c")

        entry = _agent_loop_registry["aenv_agent"]
        mod, _, cls = entry["_target_"].rpartition(".")
        Loop = getattr(importlib.import_module(mod), cls)
        cfg = NS(actor_rollout_ref=NS(rollout=NS(response_length=4096)))
        grade = ("mkdir -p /logs/verifier && r=0 && [ \\"$(cat /home/user/ans)\\" = 7 ] "
                 "&& r=1; echo $r > /logs/verifier/reward.txt")
        extra = {"aenv": {"template": "base", "setup": ["echo 3 4 > ~/q"], "reward_cmd": grade}}
        server = Server([["<bash>cat ~/q</bash>", "<bash>echo 7 > ~/ans</bash>", "done"],
                         ["<bash>echo 8 > ~/ans</bash>", "done"]])
        results = []
        for _ in range(2):  # two rollouts of one prompt: one uid
            loop = Loop(trainer_config=DictConfigWrap(config=cfg), server_manager=server,
                        tokenizer=Tokenizer(), processor=None, hf_model_type=None,
                        dataset_cls=None, data_config=DictConfigWrap(NS()), tools=None)
            o = await loop.run({"temperature": 1.0}, raw_prompt=[
                {"role": "user", "content": "Write the sum of ~/q to ~/ans."}], uid="prompt-7",
                extra_info=extra, tools_kwargs={}, index=0, data_source="t", priority=0)
            text = "".join(map(chr, o.response_ids))
            results.append({"reward": o.reward_score, "turns": o.num_turns,
                            "mask_ok": len(o.response_mask) == len(o.response_ids),
                            "saw": "3 4" in text, "status": o.extra_fields["aenv_reward_status"]})
        out["loop"] = results
        print(json.dumps(out))

    asyncio.run(main())
"""


def test_verl_tool_and_agent_loop_as_verl_drives_them(node: NodeProcess, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for rel, text in VERL_0_9_1.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(textwrap.dedent(text))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    before, ops0 = _sandboxes(node), _rl_ops(node)
    out = _run(node, DRIVE)
    assert out["schema"] == "bash"
    # One sandbox per trajectory across verl's per-call instances, from the group's state.
    assert out["tool"] == ["start\n", "none\n", "a\n", {"exit_code": 4}]
    assert out["after_idle"] == ["traj-c"]
    assert out["loop"] == [
        {"reward": 1.0, "turns": 3, "mask_ok": True, "saw": True, "status": "ok"},
        {"reward": 0.0, "turns": 2, "mask_ok": True, "saw": False, "status": "ok"}]
    ops = _rl_ops(node)
    assert _delta(ops, ops0, ("setup", "ok")) == 2  # the tool's group, the prompt's group
    assert _sandboxes(node) == before
