"""Trainers' own E2B backends against a node (issue 31), installed from the registries into
venvs of their own (`$AENV_TEST_VENVS`, default /var/cache/aenv-test-venvs; made once):

- Harbor 0.26 (`harbor[e2b]==0.26.0`, Python 3.12): `harbor run -a oracle -e e2b` on a
  Dockerfile task FROM a loopback registry image, `-n 1` then 8 trials at once: reward 1
  each, one template build, and a second run builds nothing;
- the same task with `-e aenv.integrations.harbor:AenvEnvironment` (issue 32; the
  `aenv-rl` wheel installed in Harbor's venv): 8 trials, 1 start state, 8 forks;
- verifiers 0.4.0 (`verifiers[e2b]==0.4.0`): two runtimes of one environment, one build.

`make test-long` only: the installs and builds take minutes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.registry import Seeded, have_tools, push_exported

from .conftest import API_KEY, NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.timeout(3600),
              pytest.mark.skipif(have_tools() is not None, reason=have_tools() or "")]

VENVS = Path(os.environ.get("AENV_TEST_VENVS", "/var/cache/aenv-test-venvs"))
PY312 = Path("/root/.pyenv/versions/3.12.1/bin/python")
ROOT = Path(__file__).resolve().parents[2]
UV = ROOT / ".uv/bin/uv"  # the Makefile's


def _venv(name: str, python: Path, requirement: str) -> Path:
    """A venv with `requirement` installed (once: it is kept between runs)."""
    root = VENVS / name
    done = root / ".installed"
    if done.exists() and done.read_text() == requirement:
        return root
    if not python.exists():
        pytest.fail(f"{python} is missing: {requirement} needs it", pytrace=False)
    subprocess.run([str(python), "-m", "venv", "--clear", str(root)], check=True)
    subprocess.run([str(root / "bin/pip"), "install", "-q", requirement], check=True,
                   timeout=1800)  # fmt: skip
    done.write_text(requirement)
    return root


@pytest.fixture(scope="module")
def debian(seeded: Seeded) -> str:
    """A Debian image on the loopback registry (trainers' images are Debian and Ubuntu: Harbor
    runs `install`, `xargs`, `id` in them): the node's minimal Debian, pushed there."""
    ref = push_exported(seeded.registry, "localhost/aenv/base-minimal:latest", "aenv/debian:12")
    if ref is None:
        pytest.fail("no base-minimal export here: run `aenv setup`", pytrace=False)
    return ref


def _harbor_task(root: Path, image: str, separate: bool = False) -> Path:
    """Harbor's task: the greeting copied to /app/answer.txt. `separate`: the verifier runs
    in a sandbox of its own (a fresh copy of the environment), the answer reaching it as an
    artifact (Harbor 0.26 puts it back at its source path); it checks it got a fresh copy:
    a file the agent left beside the answer, not an artifact, is not there."""
    task = root / ("greeting-separate" if separate else "greeting")
    for d in ("environment", "solution", "tests"):
        (task / d).mkdir(parents=True)
    (task / "instruction.md").write_text("Write the greeting in /app/data.txt to "
                                         "/app/answer.txt.\n")  # fmt: skip
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n'
        + ('artifacts = [{source = "/app/answer.txt", destination = "answer.txt"}]\n'
           if separate else "")
        + '[agent]\ntimeout_sec = 600.0\n[verifier]\ntimeout_sec = 600.0\n'
        + ('environment_mode = "separate"\n' if separate else "")
        + "[environment]\nbuild_timeout_sec = 1800.0\ncpus = 1\nmemory_mb = 512\n")
    fresh = " && [ ! -e /app/agent-only.txt ]" if separate else ""
    (task / "environment/data.txt").write_text("hello from the context\n")
    (task / "environment/Dockerfile").write_text(
        f"FROM {image}\nENV GREETING=hello\nWORKDIR /app\nCOPY data.txt /app/data.txt\n"
        "RUN echo built > /app/built.txt\n")
    for path, body in (
        ("solution/solve.sh", "cat /app/data.txt > /app/answer.txt\n"
                              "touch /app/agent-only.txt\n"),
        ("tests/test.sh", 'mkdir -p /logs/verifier\nif [ "$(cat /app/answer.txt)" = '
                          '"hello from the context" ] && [ "$GREETING" = hello ] && '
                          f'[ -f /app/built.txt ]{fresh}; then echo 1; else echo 0; fi '
                          "> /logs/verifier/reward.txt\n"),
    ):  # fmt: skip
        (task / path).write_text("#!/bin/sh\n" + body)
        (task / path).chmod(0o755)
    return task


def _builds_of(node: NodeProcess, prefix: str) -> int:
    """How many template builds of `prefix…` the node started (its log says each)."""
    return len(re.findall(rf"build \S+ of {prefix}\S* started", node.log.read_text()))


def _harbor_run(venv: Path, node: NodeProcess, task: Path, jobs: Path, trials: int,
                environment: str = "e2b") -> list:  # fmt: skip
    env = {**os.environ, "E2B_API_URL": node.origin, "E2B_SANDBOX_URL": node.origin,
           "E2B_API_KEY": API_KEY, "HARBOR_TELEMETRY": "0", "NO_COLOR": "1"}  # fmt: skip
    p = subprocess.run([str(venv / "bin/harbor"), "run", "-p", str(task), "-a", "oracle",
                        "-e", environment, "-o", str(jobs), "-k", str(trials), "-n",
                        str(trials)],
                       env=env, capture_output=True, text=True, timeout=3000)  # fmt: skip
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    rewards = []
    for result in jobs.rglob("result.json"):
        r = json.loads(result.read_text())
        if "verifier_result" in r:  # a trial's (the job's own result.json has none)
            vr = r["verifier_result"] or {}
            rewards.append((vr.get("rewards") or {}).get("reward"))
    assert len(rewards) == trials, (rewards, p.stdout[-4000:])
    return rewards


def test_harbor_026_runs_a_dockerfile_task_with_one_build(node: NodeProcess, debian: str,
                                                          tmp_path: Path) -> None:
    venv = _venv("harbor-0.26", PY312, "harbor[e2b]==0.26.0")
    task = _harbor_task(tmp_path, debian)
    t0 = time.monotonic()
    assert _harbor_run(venv, node, task, tmp_path / "jobs1", 1) == [1.0]
    print(f"harbor -n 1: {time.monotonic() - t0:.0f} s")
    assert _builds_of(node, "harbor-") == 1
    t0 = time.monotonic()
    assert _harbor_run(venv, node, task, tmp_path / "jobs8", 8) == [1.0] * 8
    print(f"harbor -k 8 -n 8: {time.monotonic() - t0:.0f} s")
    assert _builds_of(node, "harbor-") == 1  # the second run built nothing
    with node.api() as c:
        assert [s for s in c.get("/v2/sandboxes").json()] == []
        for t in c.get("/templates").json():
            if t["templateID"].startswith("harbor-"):
                assert c.delete(f"/templates/{t['templateID']}").status_code == 204


def _rl_ops(node: NodeProcess) -> dict[str, float]:
    text = httpx.get(node.origin + "/metrics", headers={"X-API-Key": API_KEY}).text
    return {f"{m[1]}/{m[2]}": float(m[3]) for m in re.finditer(
        r'^aenv_rl_ops_total\{op="(\w+)",outcome="(\w+)"\} ([0-9.e+]+)$', text, re.M)}


def _harbor_with_aenv_rl(tmp_path: Path) -> Path:
    """Harbor 0.26's venv with the `aenv-rl` wheel of this checkout installed in it."""
    venv = _venv("harbor-0.26", PY312, "harbor[e2b]==0.26.0")
    wheels = tmp_path / "wheels"
    subprocess.run([str(UV), "build", "--wheel", str(ROOT / "clients/aenv-rl"), "-o",
                    str(wheels)], check=True, capture_output=True)  # fmt: skip
    subprocess.run([str(UV), "pip", "install", "--python", str(venv / "bin/python"),
                    "--no-deps", "--reinstall", *map(str, wheels.glob("*.whl"))],
                   check=True, capture_output=True)  # fmt: skip
    return venv


def test_harbor_026_with_aenvs_environment_forks_every_trial(node: NodeProcess, debian: str,
                                                            tmp_path: Path) -> None:
    """issue 32: `-e aenv.integrations.harbor:AenvEnvironment` (the `aenv-rl` wheel,
    installed in Harbor's own venv): one start state per task, every trial a fork of it."""
    venv = _harbor_with_aenv_rl(tmp_path)
    task = _harbor_task(tmp_path, debian)
    before = _rl_ops(node)
    t0 = time.monotonic()
    rewards = _harbor_run(venv, node, task, tmp_path / "jobs", 8,
                          "aenv.integrations.harbor:AenvEnvironment")  # fmt: skip
    print(f"harbor -k 8 -n 8 (AenvEnvironment): {time.monotonic() - t0:.0f} s")
    assert rewards == [1.0] * 8
    after = _rl_ops(node)
    assert after.get("setup/ok", 0) - before.get("setup/ok", 0) == 1
    assert after.get("member/ok", 0) - before.get("member/ok", 0) == 8
    with node.api() as c:  # harbor's process ended: its lease, and the start state, with it
        assert c.get("/v2/sandboxes").json() == []


def test_harbor_026_separate_verifier_with_aenvs_environment(node: NodeProcess, debian: str,
                                                             tmp_path: Path) -> None:
    """issue 32: Harbor's `separate` verifier mode with AenvEnvironment: the verifier's
    sandbox is a fork of the task's pristine start state (as `evaluate` from a snapshot),
    the agent's answer reaching it as an artifact."""
    venv = _harbor_with_aenv_rl(tmp_path)
    task = _harbor_task(tmp_path, debian, separate=True)
    before = _rl_ops(node)
    rewards = _harbor_run(venv, node, task, tmp_path / "jobs", 2,
                          "aenv.integrations.harbor:AenvEnvironment")  # fmt: skip
    assert rewards == [1.0, 1.0]
    after = _rl_ops(node)
    assert after.get("setup/ok", 0) - before.get("setup/ok", 0) == 1  # one start state
    assert after.get("member/ok", 0) - before.get("member/ok", 0) == 4  # 2 agents, 2 verifiers
    with node.api() as c:
        assert c.get("/v2/sandboxes").json() == []


VERIFIERS_SCRIPT = """
import asyncio, sys
from verifiers.v1.runtimes import E2BConfig, provision_runtime

async def main(image):
    cfg = E2BConfig(image=image, cpu=1, memory=0.5)
    for i in range(2):  # two evaluations of one environment: the second builds nothing
        async with provision_runtime(cfg, name=f"eval-{i}") as rt:
            r = await rt.run(["sh", "-c", "echo $((6*7)) $A; whoami"], {"A": "1"})
            assert r.stdout.split() == ["42", "1", "root"], r
            await rt.write("d/x.bin", bytes(range(256)))
            assert await rt.read("d/x.bin") == bytes(range(256))
            p = await rt.run_program(["sh", "-c", "echo o; echo e >&2; exit 3"], {})
            assert p.exit_code == 3, p
    print("verifiers: ok")

asyncio.run(main(sys.argv[1]))
"""


def test_verifiers_runtime_builds_its_template_once(node: NodeProcess, seeded: Seeded,
                                                    tmp_path: Path) -> None:
    venv = _venv("verifiers-0.4", Path("/usr/bin/python3.11"), "verifiers[e2b]==0.4.0")
    env = {**os.environ, "E2B_API_URL": node.origin, "E2B_SANDBOX_URL": node.origin,
           "E2B_API_KEY": API_KEY, "HOME": str(tmp_path)}  # its build lock lives in ~/.cache
    p = subprocess.run([str(venv / "bin/python"), "-c", VERIFIERS_SCRIPT, seeded.multi],
                       env=env, capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert p.returncode == 0 and "verifiers: ok" in p.stdout, p.stdout[-4000:] + p.stderr[-4000:]
    assert _builds_of(node, "vf-") == 1
    with node.api() as c:
        assert c.get("/v2/sandboxes").json() == []
        for t in c.get("/templates").json():
            if t["templateID"].startswith("vf-"):
                assert c.delete(f"/templates/{t['templateID']}").status_code == 204
