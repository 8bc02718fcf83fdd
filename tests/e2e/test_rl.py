"""The RL plane on a real node (issue 32): groups joined by key from one prepared start
state, group-wide operations, reward in a throwaway fork, and leases that reclaim what a
SIGKILLed trainer held. Real VMs of `base`, the `aenv.rl` client and the unmodified SDK.

The light fixture: three 256 KiB files under ~/w, a background counter writing /tmp/c, a
variable exported in a file. The 4 x 8 group bench and the heavy fixture: bench/rl.py."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from aenv.orchestrator import census as census_mod
from aenv.rl import RL, Background, Setup
from tests.support import census

from .conftest import API_KEY, DATA_DIR, NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

LIGHT = Setup(commands=[
    "mkdir -p ~/w && for i in 1 2 3; do head -c 262144 /dev/urandom > ~/w/f$i; done",
    "echo 'export RLVAR=from-setup' > ~/w/env.sh",
    # Written whole (renamed): a reader never sees the file truncated.
    Background("i=0; while :; do i=$((i+1)); echo $i > /tmp/c.n; mv /tmp/c.n /tmp/c; "
               "sleep 0.2; done"),
])
STATE = ("cd ~/w && cat f1 f2 f3 env.sh | sha256sum | cut -c1-16; "
         "cat /proc/sys/kernel/random/uuid; date +%s.%N; cat /tmp/c; sleep 1; cat /tmp/c; "
         ". ~/w/env.sh && echo $RLVAR")  # fmt: skip


@pytest.fixture
def rl(node: NodeProcess) -> Iterator[RL]:
    with RL(node.origin, API_KEY) as client:
        yield client


def _rl_ops(node: NodeProcess) -> dict[tuple[str, str], float]:
    text = httpx.get(node.origin + "/metrics", headers={"X-API-Key": API_KEY}).text
    return {(m[1], m[2]): float(m[3]) for m in re.finditer(
        r'^aenv_rl_ops_total\{op="(\w+)",outcome="(\w+)"\} ([0-9.e+]+)$', text, re.M)}


def _delta(after: dict[tuple[str, str], float], before: dict[tuple[str, str], float],
           key: tuple[str, str]) -> float:  # fmt: skip
    return after.get(key, 0.0) - before.get(key, 0.0)


def _snapshot_names(node: NodeProcess) -> list[str]:
    with node.api() as c:
        return [n for s in c.get("/snapshots").json() for n in [s["snapshotID"], *s["names"]]]


def _snapshot_dirs() -> set[str]:
    return {p.name for p in (DATA_DIR / "snapshots").iterdir()}


def _sandboxes(node: NodeProcess) -> set[str]:
    with node.api() as c:
        return {s["sandboxID"] for s in c.get("/v2/sandboxes").json()}


def test_a_group_forks_one_start_state_for_every_member(node: NodeProcess, rl: RL) -> None:
    before = _rl_ops(node)
    with rl.lease(120) as lease:
        with ThreadPoolExecutor(4) as pool:  # 4 samples of one prompt call at once
            got = list(pool.map(lambda _: lease.join("prompt-a", template="base",
                                                     setup=LIGHT, n=2), range(4)))
        assert len({m.group_id for m in got}) == 1
        assert sum(m.created_group for m in got) == 1
        assert sorted(m.index for m in got) == [0, 1, 2, 3]
        ids = {m.sandbox_id for m in got}
        assert len(ids) == 4
        after = _rl_ops(node)
        assert _delta(after, before, ("setup", "ok")) == 1
        assert _delta(after, before, ("member", "ok")) == 4
        group = got[0].group
        host_t0 = time.time()
        res = group.exec(STATE)
        host_t1 = time.time()
        assert {r["sandboxID"] for r in res} == ids and all(r["exitCode"] == 0 for r in res), res
        rows = [r["stdout"].split() for r in res]
        assert len({row[0] for row in rows}) == 1  # the same tree in every member
        assert len({row[1] for row in rows}) == 4  # each its own kernel entropy
        for row in rows:
            # clock close to the host's: read while the exec ran (4 guests on a loaded host
            # may take seconds to answer)
            assert host_t0 - 2 < float(row[2]) < host_t1 + 2, (row, host_t0, host_t1)
            assert int(row[4]) > int(row[3])  # the setup's counter runs in each member
            assert row[5] == "from-setup"
        # No member's write reaches a sibling (nor the start state: a new member).
        first = got[0].sandbox()
        first.commands.run("echo changed > ~/w/f1")
        again = {r["sandboxID"]: r["stdout"].split()[0] for r in group.exec(STATE)}
        assert again[first.sandbox_id] != rows[0][0]
        assert len({v for k, v in again.items() if k != first.sandbox_id}) == 1
        late = lease.join("prompt-a")  # a fifth sample: forked on demand
        assert late.index == 4 and late.sandbox_id not in ids
        fresh = late.sandbox().commands.run("cd ~/w && cat f1 f2 f3 env.sh | sha256sum")
        assert fresh.stdout[:16] == rows[0][0]
        # Group-wide pause and resume.
        assert all(r["ok"] for r in group.pause()), "pause"
        assert {m["state"] for m in group.info()["members"]} == {"paused"}
        assert all(r["ok"] for r in group.resume()), "resume"
        assert all(r.get("exitCode") == 0 for r in group.exec("cat /tmp/c"))
        info = group.info()
        assert info["joins"] == 5 and len(info["members"]) == 5
        start = info["startSnapshotID"]
        assert (DATA_DIR / "snapshots" / start).is_dir()
        assert start not in str(_snapshot_names(node))  # the RL plane's: not listed
    # The lease's end took the group: members, start state.
    assert not ids & _sandboxes(node)
    assert not (DATA_DIR / "snapshots" / start).exists()


def test_a_member_whose_vmm_died_is_replaced(node: NodeProcess, rl: RL) -> None:
    with rl.lease(120) as lease:
        m = lease.join("prompt-b", template="base", n=2)
        group = m.group
        members = [x["sandboxID"] for x in group.info()["members"]]
        victim = members[1]
        inst = node.env["AENV_INSTANCE"]
        (pid,) = census_mod.census(census.cfg_for(inst), inst).vmm_pids(inst, victim)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while victim in _sandboxes(node):
            assert time.monotonic() < deadline, "the dead member was not removed"
            time.sleep(0.1)
        assert [x["state"] for x in group.info()["members"]] == ["running", "gone"]
        res = group.exec("true")
        assert res[1].get("error") and res[0]["exitCode"] == 0
        out = group.replace_failed()
        (rep,) = out["replaced"]
        assert rep["old"] == victim and rep["index"] == 1
        after = out["group"]["members"]
        assert after[1]["sandboxID"] == rep["new"] and after[1]["replacedFrom"] == victim
        assert all(r["exitCode"] == 0 for r in group.exec("true"))
        group.end()
        assert not set(members) & _sandboxes(node) and rep["new"] not in _sandboxes(node)


def test_evaluate_runs_in_a_throwaway_fork(node: NodeProcess, rl: RL) -> None:
    sbx = Sandbox.create("base", timeout=300)
    try:
        for cmd in LIGHT.commands:
            if isinstance(cmd, Background):
                sbx.commands.run(cmd.cmd, background=True)
            else:
                sbx.commands.run(cmd)
        tree = "cd ~/w && cat f1 f2 f3 env.sh | sha256sum"
        before = sbx.commands.run(tree).stdout
        ok = rl.evaluate(sbx.sandbox_id, "mkdir -p /logs/verifier && echo 0.75 > "
                         "/logs/verifier/reward.txt && echo graded")  # fmt: skip
        assert (ok.status, ok.reward, ok.exit_code, ok.stdout) == ("ok", 0.75, 0, "graded\n")
        # A verifier that destroys its sandbox: the sandbox it graded is untouched.
        bad = rl.evaluate(sbx.sandbox_id, "rm -rf ~/w /home/user/w; kill -9 -1",
                          user="user")  # fmt: skip
        assert bad.status == "error" and bad.reward is None, bad
        c0 = int(sbx.commands.run("cat /tmp/c").stdout)
        time.sleep(1)
        assert sbx.commands.run(tree).stdout == before
        assert int(sbx.commands.run("cat /tmp/c").stdout) > c0
        # No number, no reward.
        none = rl.evaluate(sbx.sandbox_id, "echo nothing", files=[])
        assert none.status == "error" and none.reward is None and "reward.txt" in none.error
        # The evaluating VMM killed mid-run: infra_error, no reward.
        known = _sandboxes(node)
        inst = node.env["AENV_INSTANCE"]
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(rl.evaluate, sbx.sandbox_id,
                              "sleep 60; echo 1 > /logs/verifier/reward.txt")
            deadline = time.monotonic() + 60
            while not (new := _sandboxes(node) - known):
                assert time.monotonic() < deadline, "no evaluation sandbox appeared"
                time.sleep(0.1)
            time.sleep(1)
            (pid,) = census_mod.census(census.cfg_for(inst), inst).vmm_pids(inst, new.pop())
            os.kill(pid, signal.SIGKILL)
            dead = fut.result(timeout=60)
        assert dead.status == "infra_error" and dead.reward is None, dead
        assert _sandboxes(node) == known  # every evaluation sandbox is gone
    finally:
        sbx.kill()


TRAINER = """
import sys, time
from aenv.rl import RL
rl = RL(sys.argv[1], sys.argv[2])
lease = rl.lease(4)
m = lease.join("prompt-lease", template="base", n=3)
print(m.group_id, flush=True)
time.sleep(600)
"""


def test_a_sigkilled_trainers_lease_lapses_and_its_group_goes(node: NodeProcess) -> None:
    before = _sandboxes(node)
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(TRAINER), node.origin,
                             API_KEY], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        group_id = proc.stdout.readline().strip()
        assert group_id.startswith("grp-"), group_id
        with node.api() as c:
            start = c.get(f"/rl/groups/{group_id}").json()["startSnapshotID"]
        time.sleep(6)  # renewed meanwhile (every lease_s / 3): still there
        assert len(_sandboxes(node) - before) == 3
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    t0 = time.monotonic()
    while _sandboxes(node) - before or (DATA_DIR / "snapshots" / start).exists():
        assert time.monotonic() - t0 < 4 + 5, "the lapsed lease's group outlived lease_s + 5 s"
        time.sleep(0.1)
    with node.api() as c:
        r = c.get(f"/rl/groups/{group_id}")
        assert r.status_code == 404 and r.json()["code"] == 404


FLEET = """
import sys, time
from aenv.rl import RL
url, key, lease_s, groups, members = sys.argv[1:]
lease = RL(url, key).lease(float(lease_s))
for k in range(int(groups)):  # n ahead: the group's members, the first join taking one
    lease.join(f"fleet-{k}", template="base", n=int(members))
print(lease.lease_id, flush=True)
time.sleep(3600)
"""


def sigkilled_fleet(origin: str, nodes: list[NodeProcess], groups: int, members: int,
                    lease_s: float) -> float:  # fmt: skip
    """A trainer at `origin` (a node or a gateway) makes `groups` x `members` members under
    one lease and is SIGKILLed: how long until no node holds any of it, by the census (no
    VMM, slot or file but what a node holds by design)."""
    def held() -> int:
        return sum(len(_sandboxes(n)) for n in nodes)

    before = held()
    proc = subprocess.Popen([sys.executable, "-c", FLEET, origin, API_KEY, str(lease_s),
                             str(groups), str(members)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("lease-")
        assert held() - before == groups * members
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    t0 = time.monotonic()
    while held() > before or any(
            census.problems(n.env["AENV_INSTANCE"], allow=census.STOPPED_NODE_KINDS)
            for n in nodes):  # fmt: skip
        assert time.monotonic() - t0 < lease_s + 5 + 30, "the fleet outlived its lease"
        time.sleep(0.2)
    return time.monotonic() - t0


@pytest.mark.long
def test_a_sigkilled_trainers_sixty_members_go_within_the_lease(node: NodeProcess) -> None:
    gone = sigkilled_fleet(node.origin, [node], 4, 15, 10)
    print(f"4 x 15 members gone {gone:.1f} s after the trainer died (lease_s 10)")
    assert gone < 10 + 5, f"4 x 15 members gone {gone:.1f} s after the trainer died"


def test_bad_rl_requests_get_clear_errors(node: NodeProcess) -> None:
    dirs = _snapshot_dirs()
    with node.api() as c:
        for body, words in [
            ({"key": "k"}, "needs a source"),
            ({"key": "k", "source": {}}, "exactly one"),
            ({"key": "k", "source": {"template": "base", "image": "x"}}, "exactly one"),
            ({"key": "k", "source": {"template": "base"}, "lease_s": 0.1}, "lease_s"),
            ({"key": "k", "source": {"template": "no-such-template"}}, "not found"),
        ]:
            r = c.post("/rl/groups", json=body)
            assert r.status_code in (400, 404), (body, r.text)
            assert words in r.json()["message"].lower() or words in r.json()["message"], r.text
        r = c.post("/rl/evaluate", json={"cmd": "true"})
        assert r.status_code == 400 and "sandboxID" in r.json()["message"]
        assert c.post("/rl/leases/lease-nope").status_code == 404
        assert c.get("/rl/groups/grp-nope").status_code == 404
        r = c.post("/rl/groups", json={"key": "k", "source": {"template": "base"},
                                       "setup": {"commands": ["exit 3"]}})  # fmt: skip
        assert r.status_code == 400 and "exited 3" in r.json()["message"], r.text
    assert _snapshot_dirs() == dirs
    assert _sandboxes(node) == set()


def test_checkpoints_roll_back_in_place_and_branch_into_a_tree(node: NodeProcess,
                                                                rl: RL) -> None:
    sbx = Sandbox.create("base", timeout=300)
    lease = rl.lease(120)
    try:
        steps, states = [], []
        for i in range(1, 7):  # each step writes 256 KiB and bumps a counter
            sbx.commands.run(f"mkdir -p ~/w && head -c 262144 /dev/urandom > ~/w/s{i} && "
                             f"echo {i} > ~/n")  # fmt: skip
            steps.append(rl.checkpoint(sbx.sandbox_id, lease=lease))
            states.append(sbx.commands.run("cat ~/n; ls ~/w; cat ~/w/* | sha256sum").stdout)
        with node.api() as c:  # the RL plane's names are its own
            r = c.post(f"/sandboxes/{sbx.sandbox_id}/snapshots", json={"name": "rl-mine"})
            assert r.status_code == 400 and "reserved" in r.json()["message"]
        stream = sbx.commands.run("sleep 600", background=True)
        for back in (2, 5):  # checkpoints survive a rollback
            r = rl.rollback(sbx.sandbox_id, steps[back - 1])
            assert r["sandboxID"] == sbx.sandbox_id
            # The same object, hence the same id and token, sees exactly that state.
            assert sbx.commands.run("cat ~/n; ls ~/w; cat ~/w/* | sha256sum").stdout == \
                states[back - 1]
        with pytest.raises(Exception):  # noqa: B017 (the stream ended as on a pause)
            stream.wait()
        assert sbx.get_info().sandbox_id == sbx.sandbox_id
        # A branch: a checkpoint after the rollback descends from step 5, not step 6.
        sbx.commands.run("echo branch > ~/w/b")
        branch = rl.checkpoint(sbx.sandbox_id, lease=lease)
        (kid,) = rl.fork_checkpoint(steps[2], 1, lease=lease)  # in step 3's state
        assert Sandbox.connect(kid).commands.run("cat ~/n").stdout == "3\n"
        tree = rl.lineage(steps[0])
        cps = {n["id"]: n for n in tree["nodes"] if n["kind"] == "checkpoint"}
        assert tree["root"] == steps[0] and set(cps) == {*steps, branch}
        assert [cps[s]["parent"] for s in steps] == [None, *steps[:-1]]
        assert cps[branch]["parent"] == steps[4]
        live = {n["id"]: n["parent"] for n in tree["nodes"] if n["kind"] == "sandbox"}
        assert live == {sbx.sandbox_id: branch, kid: steps[2]}
        # Pruning step 4's subtree: steps 4-6, the branch, and the sandbox heading it go.
        snap_dirs = [DATA_DIR / "snapshots" / cps[s]["snapshotID"]
                     for s in (*steps[3:], branch)]  # fmt: skip
        assert all(d.exists() for d in snap_dirs)
        gone = rl.delete_checkpoint(steps[3])
        assert set(gone["checkpoints"]) == {*steps[3:], branch}
        assert gone["sandboxes"] == [sbx.sandbox_id]
        assert not any(d.exists() for d in snap_dirs)
        assert sbx.sandbox_id not in _sandboxes(node)
        left = {n["id"] for n in rl.lineage(steps[0])["nodes"]}
        assert left == {*steps[:3], kid}
    finally:
        lease.close()  # the fork from step 3 goes with it; then nothing holds the steps
        with contextlib.suppress(Exception):
            sbx.kill()
    deadline = time.monotonic() + 10
    while (DATA_DIR / "snapshots" / cps[steps[0]]["snapshotID"]).exists():
        assert time.monotonic() < deadline, "unreferenced checkpoints were not collected"
        time.sleep(0.2)


@pytest.mark.long  # ~25 s
def test_the_gymnasium_environment_passes_check_env_and_clones(node: NodeProcess,
                                                               rl: RL) -> None:
    from gymnasium.utils.env_checker import check_env

    from aenv.rl import GymEnv

    env = GymEnv(rl, template="base", setup=Setup(commands=["echo 0 > ~/score"]),
                 reward_cmd="mkdir -p /logs/verifier && "
                            "cp /home/user/score /logs/verifier/reward.txt",
                 max_steps=4)  # fmt: skip
    try:
        check_env(env, skip_render_check=True)
        obs, info = env.reset(seed=1)
        assert obs == "" and info["sandbox_id"] in _sandboxes(node)
        obs, reward, term, trunc, _ = env.step("echo hello; echo 0.5 > ~/score")
        assert (obs, reward, term, trunc) == ("hello\n", 0.0, False, False)
        clones = env.clone(8)
        for i, c in enumerate(clones):  # each goes its own way from the shared state
            c.step(f"echo {i} > ~/mine")
        seen = [c.step("cat ~/mine ~/score")[0] for c in clones]
        assert seen == [f"{i}\n0.5\n" for i in range(8)]
        assert env.step("cat ~/mine")[0].endswith("No such file or directory\n")
        _, reward, term, _, info = clones[3].step("submit")
        assert (reward, term, info["reward_status"]) == (0.5, True, "ok")
        for c in clones:
            c.close()
    finally:
        env.close()
    assert _sandboxes(node) == set()


def test_the_scripted_grpo_example_gets_the_rewards_its_actions_are_due(
        node: NodeProcess) -> None:  # fmt: skip
    example = Path(__file__).resolve().parents[2] / "examples/grpo_scripted.py"
    p = subprocess.run([sys.executable, str(example), "--steps", "1",
                        "--prompts", "2", "--group", "4"], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "E2B_API_URL": node.origin,
                                         "E2B_SANDBOX_URL": node.origin,
                                         "E2B_API_KEY": API_KEY})  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert "rewards not as expected: 0" in p.stdout
    assert p.stdout.count("advantages") == 2
    assert _sandboxes(node) == set()
