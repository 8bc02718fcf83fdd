"""Trainer adapters on a real node (issue 32), each in a process of its own as a trainer's
worker would be (its process lease ends at exit): SkyRL's environment with the real
skyrl-gym 0.4.0 and SkyRL's generator hook called as skyrl 0.3.0 calls it (pinned: skyrl
imports torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import API_KEY, NodeProcess
from .test_rl import _delta, _rl_ops, _sandboxes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def _run(node: NodeProcess, code: str) -> dict[str, object]:
    env = {**os.environ, "E2B_API_URL": node.origin, "E2B_SANDBOX_URL": node.origin,
           "E2B_API_KEY": API_KEY, "AENV_RL_LEASE_S": "60"}  # fmt: skip
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, timeout=500,
                       capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


SKYRL = """
    import dataclasses, json
    import skyrl_gym
    import aenv.integrations.skyrl as aenv_skyrl

    @dataclasses.dataclass
    class TrajectoryID:  # skyrl/train/generators/base.py, skyrl 0.3.0
        instance_id: str
        repetition_id: int

    aenv_skyrl.register()
    aenv_skyrl.register()  # a second call (another import of the module) is a no-op
    grade = ("mkdir -p /logs/verifier && r=0 && [ \\"$(cat /home/user/n)\\" = 42 ] && r=1; "
             "echo $r > /logs/verifier/reward.txt")
    row = {"aenv": {"template": "base", "setup": ["echo 41 > ~/n"], "reward_cmd": grade},
           "uid": "task-1", "max_turns": 4}
    prompt = [{"role": "user", "content": "make ~/n hold 42"}]
    out = {}
    # As SkyRLGymGenerator.agent_loop does: the hook, then make(env_class, env_config, extras).
    for rep, actions in enumerate([
            ["<bash>echo 42 > ~/n</bash>", "<bash>cat ~/n</bash>", "done <submit/>"],
            ["I will not do it."]]):
        extras = aenv_skyrl.setup_env_extras("aenv", dict(row), None, TrajectoryID("task-1", rep))
        env = skyrl_gym.make("aenv", env_config={}, extras=extras)
        assert isinstance(env, skyrl_gym.Env)
        obs, info = env.init(prompt)
        steps = [env.step(a) for a in actions]
        env.close()
        out[rep] = {"obs": obs == prompt, "sandbox": info["sandbox_id"],
                    "steps": [{"o": s["observations"], "r": s["reward"], "d": s["done"]}
                              for s in steps], "metrics": env.get_metrics()}
    # The batched path: no hook, the environment joins the group of the row's uid itself.
    env = skyrl_gym.make("aenv", env_config={}, extras=dict(row))
    env.init(prompt)
    out["batched"] = env.step("<bash>cat ~/n</bash>")["observations"][0]["content"]
    env.close()
    print(json.dumps(out))
"""


def test_skyrl_environment_runs_episodes_in_one_group(node: NodeProcess) -> None:
    before, ops0 = _sandboxes(node), _rl_ops(node)
    out = _run(node, SKYRL)
    good, bad = out["0"], out["1"]  # type: ignore[index]
    assert good["obs"] and bad["obs"]
    assert [s["d"] for s in good["steps"]] == [False, False, True]
    assert good["steps"][1]["o"] == [{"role": "user", "content": "42\n"}]
    assert good["steps"][2]["r"] == 1.0 and good["metrics"] == {"turns": 3, "reward": 1.0}
    assert bad["steps"] == [{"o": [], "r": 0.0, "d": True}]  # no command: graded at once
    assert good["sandbox"] != bad["sandbox"]
    assert out["batched"] == "41\n"  # a fresh member: the start state's ~/n
    ops = _rl_ops(node)
    assert _delta(ops, ops0, ("setup", "ok")) == 1  # one start state for the task
    assert _delta(ops, ops0, ("member", "ok")) >= 3
    assert _sandboxes(node) == before  # the process's lease ended with it


NEMO_GYM = """
    import asyncio, dataclasses, json, tempfile
    from pathlib import Path
    from aenv.integrations.nemo_gym import AenvProvider, SandboxStatus

    @dataclasses.dataclass(frozen=True)
    class SandboxSpec:  # nemo_gym/sandbox/providers/base.py, nemo-gym 0.7.0
        image: str | None = None
        ttl_s: float | None = None
        ready_timeout_s: float | None = None
        workdir: str | None = None
        env: dict = dataclasses.field(default_factory=dict)
        files: dict = dataclasses.field(default_factory=dict)
        metadata: dict = dataclasses.field(default_factory=dict)
        resources: dict = dataclasses.field(default_factory=dict)
        entrypoint: list | None = None
        provider_options: dict = dataclasses.field(default_factory=dict)
        ports: tuple = ()

    async def main():
        p = AenvProvider(template="base")  # as create_provider({"aenv": {...}}) makes it
        out = {"name": p.name}
        agent = await p.create(SandboxSpec(env={"V": "from-spec"}, metadata={"run": "t"}))
        r = await p.exec(agent, "echo agent > ~/f && echo $V", timeout_s=60)
        out["exec"] = [r.stdout, r.return_code]
        r = await p.exec(agent, "exit 3")
        out["exit"] = r.return_code
        src = Path(tempfile.mkdtemp()) / "up.bin"
        src.write_bytes(b"\\x00\\x01payload")
        await p.upload_file(agent, src, "/tmp/up.bin")
        await p.download_file(agent, "/tmp/up.bin", src.with_name("down.bin"))
        out["roundtrip"] = src.with_name("down.bin").read_bytes() == src.read_bytes()
        # The verifier's sandbox: a fork of the agent's, at the agent's state.
        ver = await p.create(SandboxSpec(provider_options={"fork_from": agent.sandbox_id}))
        out["fork_sees"] = (await p.exec(ver, "cat ~/f && echo v > ~/g")).stdout
        out["agent_untouched"] = (await p.exec(agent, "ls ~/g")).return_code != 0
        await p.pause(agent)
        out["paused"] = (await p.status(agent)) == SandboxStatus.PAUSED
        await p.resume(agent)
        out["resumed"] = [(await p.status(agent)) == SandboxStatus.RUNNING,
                          (await p.exec(agent, "cat ~/f")).stdout]
        again = await p.connect(await p.serialize_handle(agent))
        out["connected"] = (await p.exec(again, "cat ~/f")).stdout
        g = [await p.create(SandboxSpec(provider_options={"group": "nemo-task"}))
             for _ in range(2)]
        out["group"] = len({h.sandbox_id for h in g})
        for h in (ver, *g):
            await p.close(h)
        out["closed"] = (await p.status(ver)) == SandboxStatus.STOPPED
        await p.close(ver)  # twice: nothing to do
        print(json.dumps(out))  # the agent's sandbox is left: the lease ends it at exit

    asyncio.run(main())
"""


def test_nemo_gym_provider_forks_the_verifier_and_pauses(node: NodeProcess) -> None:
    before, ops0 = _sandboxes(node), _rl_ops(node)
    out = _run(node, NEMO_GYM)
    assert out == {"name": "aenv", "exec": ["from-spec\n", 0], "exit": 3, "roundtrip": True,
                   "fork_sees": "agent\n", "agent_untouched": True, "paused": True,
                   "resumed": [True, "agent\n"], "connected": "agent\n", "group": 2,
                   "closed": True}  # fmt: skip
    assert _delta(_rl_ops(node), ops0, ("setup", "ok")) == 1
    assert _sandboxes(node) == before  # the process's lease ended with it


def test_the_adapter_examples_run(node: NodeProcess) -> None:
    before = _sandboxes(node)
    examples = Path(__file__).resolve().parents[2] / "examples"
    run = "import runpy; runpy.run_path({!r}, run_name='__main__')"
    assert _run(node, run.format(str(examples / "skyrl_env.py"))) == {"rewards": [1.0, 0.0, 0.0]}
    assert _run(node, run.format(str(examples / "nemo_gym_provider.py"))) == {
        "verdict": "pass", "exit_code": 0}
    assert _run(node, run.format(str(examples / "verl_sandbox_fusion.py"))) == {"score": 1.0}
    assert _sandboxes(node) == before
