"""NeMo Gym's sandbox provider on aenv: the agent works in one sandbox, the verifier grades a
fork of it (`provider_options={"fork_from": ...}`), so grading starts where the agent
stopped without a boot or a replay, and cannot disturb the agent's sandbox.

    E2B_API_URL=http://127.0.0.1:8000 E2B_API_KEY=... python examples/nemo_gym_provider.py

With nemo-gym installed (Python >= 3.13.14) the provider is found by name, `aenv`, through
the `nemo_gym.sandbox_providers` entry point of the aenv-rl wheel; this example makes it
directly, with a spec of the same fields as nemo-gym 0.7.0's SandboxSpec."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from aenv.integrations.nemo_gym import AenvProvider


@dataclasses.dataclass(frozen=True)
class Spec:  # nemo_gym.sandbox.SandboxSpec's fields that the provider reads
    image: str | None = None
    ttl_s: float | None = 600
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)
    provider_options: dict[str, Any] = dataclasses.field(default_factory=dict)


async def main() -> None:
    provider = AenvProvider(template="base")
    agent = await provider.create(Spec())
    await provider.exec(agent, "mkdir -p ~/repo && echo 'def add(a, b): return a + b' "
                               "> ~/repo/calc.py")  # the agent's work
    verifier = await provider.create(Spec(provider_options={"fork_from": agent.sandbox_id}))
    r = await provider.exec(verifier, "cd ~/repo && python3 -c "
                                      "'import calc; assert calc.add(2, 3) == 5' && echo pass")
    await provider.close(verifier)
    await provider.close(agent)
    await provider.aclose()
    print(json.dumps({"verdict": r.stdout.strip(), "exit_code": r.return_code}))


if __name__ == "__main__":
    asyncio.run(main())
