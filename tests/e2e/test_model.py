"""Stateful model test: hypothesis drives a real node through create / exec / pause / resume /
fork / snapshot / kill, kill -9 of a sandbox's QEMU and kill -9 + restart of the node, and
checks after every step that the node's records match the model and the host (leak census:
no leak and no ghost: a sandbox whose QEMU the test killed is removed by the node, as a kill
removes it) and, whenever a sandbox is resumed (and for every paused one at the end), that
its memory is intact.

CI runs a short version with a fixed seed, which must run every rule at least once (the test
fails otherwise); `AENV_MODEL_LONG=1` runs a long one (more examples and steps, a random seed:
each long run explores new sequences; AENV_MODEL_EXAMPLES and AENV_MODEL_STEPS override the
sizes, and then which rules run is not checked).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from e2b import Sandbox
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from aenv.orchestrator import census as census_mod
from tests.support import census

from .conftest import API_KEY, NodeProcess, free_port, require_base_template

LONG = os.environ.get("AENV_MODEL_LONG") == "1"
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(7200 if LONG else 300)]

# The short run's seed: with it, 4 examples of 10 steps (the first of each the initialize
# rule) run every rule, and the test asserts they did. Which rules run is a function of the
# seed alone: hypothesis (pinned) draws from a random seeded by it, and every choice it makes
# (go on or stop, which rule among the enabled ones, which sandbox or snapshot by index)
# depends only on the model's state, which evolves from those choices alone as long as every
# step passes: picks go by creation order, never by the node's random ids. So a run with a
# fake node shows what a real one runs (tests/unit/test_model_rules.py does, on every CI run).
# A change to the rules, their preconditions or the sizes may need a new seed (that unit test
# says which rule no longer runs).
SHORT_SEED = 1
SHORT_EXAMPLES, SHORT_STEPS = 4, 10
SIZED = "AENV_MODEL_EXAMPLES" in os.environ or "AENV_MODEL_STEPS" in os.environ
SEEDED = not LONG and not SIZED  # the CI run: every rule must run
SETTINGS = settings(
    max_examples=int(os.environ.get("AENV_MODEL_EXAMPLES", 10 if LONG else SHORT_EXAMPLES)),
    stateful_step_count=int(os.environ.get("AENV_MODEL_STEPS", 40 if LONG else SHORT_STEPS)),
    deadline=None, database=None, print_blob=True,
    # Shrinking replays steps against a real node (seconds each): report the run as found.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=list(HealthCheck),
)  # fmt: skip
MAX_SANDBOXES = 4  # in the model at once: a 2-core TCG host
MARKER = "/dev/shm/aenv-marker"  # tmpfs: guest RAM; only a memory resume keeps it
TTL_S = 1800
# A QEMU's death -> its sandbox removed: well under a second here; generous for a busy host.
GONE_DEADLINE_S = 30


@dataclass
class Env:
    """The node (its successive processes: one instance, one port) and what was done."""

    log_dir: Path
    instance: str = field(default_factory=census.new_instance)
    port: int = field(default_factory=free_port)
    node: NodeProcess | None = None
    starts: int = 0
    steps: Counter[str] = field(default_factory=Counter)  # rule -> times run (as a rule)

    def start(self) -> None:
        self.starts += 1
        self.node = NodeProcess(self.port, self.log_dir / f"node-{self.starts:03d}.log",
                                extra_env={"AENV_INSTANCE": self.instance,
                                           "AENV_WARM_POOL_SIZE": "1"})  # fmt: skip
        self.node.start()

    def restart(self) -> None:
        assert self.node is not None
        self.node.kill9()
        self.start()

    def listed(self) -> dict[str, str]:
        assert self.node is not None
        with self.node.api() as c:
            return {s["sandboxID"]: s["state"] for s in c.get("/v2/sandboxes").json()}

    def census(self) -> census_mod.Census:
        return census_mod.census(census.cfg_for(self.instance), self.instance)


@dataclass
class Box:
    sbx: Sandbox
    state: str  # running | paused
    marker: str  # what MARKER holds in its RAM
    pid: int  # a background process in it


def _marked(s: Sandbox) -> Box:
    s.files.write(MARKER, s.sandbox_id)
    return Box(s, "running", s.sandbox_id, s.commands.run("sleep 100000", background=True,
                                                          timeout=0).pid)  # fmt: skip


def _assert_intact(b: Box) -> None:
    r = b.sbx.commands.run(f"cat {MARKER}; echo; test -d /proc/{b.pid} && echo alive")
    assert r.stdout == f"{b.marker}\nalive\n", r.stdout


class NodeModel(RuleBasedStateMachine):
    env: Env  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.boxes: dict[str, Box] = {}
        self.snaps: dict[str, tuple[str, int]] = {}  # snapshot id -> (marker, pid)
        self.restarted = False  # the last step was a restart
        e = self.env
        if e.node is None or e.node.proc is None or e.node.proc.poll() is not None:
            e.start()
        for sid in e.listed():  # what a failed example left
            Sandbox.kill(sid)

    def _step(self, rule: str) -> None:
        self.env.steps[rule] += 1
        self.restarted = rule == "restart_node"

    def _ids(self, *states: str) -> list[str]:
        # In creation order, not sorted: the ids are random, and an order by them would make
        # which sandbox a drawn index names, and so the model's path, vary from run to run.
        return [s for s, b in self.boxes.items() if b.state in states]

    def _pick(self, data: st.DataObject, *states: str) -> tuple[str, Box]:
        sid = data.draw(st.sampled_from(self._ids(*states)), label="sandbox")
        return sid, self.boxes[sid]

    def _room(self) -> bool:
        return len(self.boxes) < MAX_SANDBOXES

    def _create(self) -> None:
        b = _marked(Sandbox.create(timeout=TTL_S))
        self.boxes[b.sbx.sandbox_id] = b

    @initialize()
    def two_sandboxes(self) -> None:
        """Start with something to operate on: every rule is enabled from the first step."""
        for _ in range(2):
            self._create()  # not counted as the rule `create`

    @precondition(lambda self: self._room())
    @rule()
    def create(self) -> None:
        self._step("create")
        self._create()

    @precondition(lambda self: self._ids("running"))
    @rule(data=st.data())
    def exec_(self, data: st.DataObject) -> None:
        self._step("exec_")
        _, b = self._pick(data, "running")
        _assert_intact(b)

    @precondition(lambda self: self._ids("running"))
    @rule(data=st.data())
    def pause(self, data: st.DataObject) -> None:
        self._step("pause")
        _, b = self._pick(data, "running")
        assert b.sbx.pause() is True
        b.state = "paused"

    @precondition(lambda self: self._ids("paused"))
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        self._step("resume")
        sid, b = self._pick(data, "paused")
        b.sbx = Sandbox.connect(sid, timeout=TTL_S)
        b.state = "running"
        _assert_intact(b)

    @precondition(lambda self: self._ids("running") and self._room())
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        self._step("fork")
        _, b = self._pick(data, "running")
        out = b.sbx.fork(count=1, timeout=TTL_S)
        kid = out[0]
        assert isinstance(kid, Sandbox), out
        k = Box(kid, "running", b.marker, b.pid)  # its parent's memory, then its own
        self.boxes[kid.sandbox_id] = k
        _assert_intact(k)

    @precondition(lambda self: self._ids("running") and len(self.snaps) < 2)
    @rule(data=st.data())
    def snapshot(self, data: st.DataObject) -> None:
        self._step("snapshot")
        _, b = self._pick(data, "running")
        info = b.sbx.create_snapshot()
        self.snaps[info.snapshot_id] = (b.marker, b.pid)

    @precondition(lambda self: self.snaps and self._room())
    @rule(data=st.data())
    def create_from_snapshot(self, data: st.DataObject) -> None:
        self._step("create_from_snapshot")
        snap = data.draw(st.sampled_from(list(self.snaps)), label="snapshot")  # creation order
        marker, pid = self.snaps[snap]
        s = Sandbox.create(template=snap, timeout=TTL_S)
        self.boxes[s.sandbox_id] = b = Box(s, "running", marker, pid)
        _assert_intact(b)

    @precondition(lambda self: self.boxes)
    @rule(data=st.data())
    def kill(self, data: st.DataObject) -> None:
        self._step("kill")
        sid, _ = self._pick(data, "running", "paused")
        assert Sandbox.kill(sid) is True
        del self.boxes[sid]

    @precondition(lambda self: self._ids("running"))
    @rule(data=st.data())
    def kill9_qemu(self, data: st.DataObject) -> None:
        """The node notices its VMM died and removes the sandbox, as a kill does."""
        self._step("kill9_qemu")
        sid, _ = self._pick(data, "running")
        pids = self.env.census().vmm_pids(self.env.instance, sid)
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + GONE_DEADLINE_S
        # Unlisted from Killing on; its record goes once its resources are released.
        while sid in self.env.listed() or sid in self.env.census().records.get(
                self.env.instance, {}):  # fmt: skip
            assert time.monotonic() < deadline, "the node did not remove the dead sandbox"
            time.sleep(0.05)
        del self.boxes[sid]

    # A restart of an empty node, or right after one, tests little.
    @precondition(lambda self: self.boxes and not self.restarted)
    @rule()
    def restart_node(self) -> None:
        """kill -9 of the node, then a new process: running sandboxes are re-adopted, paused
        ones stay paused."""
        self._step("restart_node")
        self.env.restart()

    @invariant()
    def records_match_the_model_and_the_host(self) -> None:
        assert self.env.listed() == {sid: b.state for sid, b in self.boxes.items()}
        d = census_mod.diff(self.env.census())
        assert d.clean, d.lines()  # no leak, and no ghost

    def teardown(self) -> None:
        """Every paused sandbox resumes with its memory; then nothing is left."""
        try:
            for sid in self._ids("paused"):
                b = self.boxes[sid]
                b.sbx = Sandbox.connect(sid, timeout=TTL_S)
                _assert_intact(b)
        finally:
            for sid in list(self.boxes):
                Sandbox.kill(sid)
            for snap in self.snaps:
                Sandbox.delete_snapshot(snap)
        d = census_mod.diff(self.env.census())
        assert d.clean, d.lines()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    e = Env(tmp_path_factory.mktemp("model"))
    mp = pytest.MonkeyPatch()
    mp.setenv("E2B_API_URL", f"http://127.0.0.1:{e.port}")
    mp.setenv("E2B_SANDBOX_URL", f"http://127.0.0.1:{e.port}")
    mp.setenv("E2B_API_KEY", API_KEY)
    try:
        e.start()
        assert e.node is not None
        require_base_template(e.node)
        yield e
        for sid in e.listed():
            Sandbox.kill(sid)
        assert e.node.stop() == 0, e.node.tail()
        leaks = census.check_stopped(e.instance)
        assert not leaks, "\n".join(leaks)
    finally:
        if e.node is not None:
            e.node.kill9()
        mp.undo()
        census.release(e.instance)


RULES = sorted(r.function.__name__ for r in NodeModel.rules())


def test_node_matches_its_model_through_random_operations_and_crashes(env: Env) -> None:
    NodeModel.env = env
    try:
        run_state_machine_as_test(NodeModel if LONG else seed(SHORT_SEED)(NodeModel),
                                  settings=SETTINGS)  # fmt: skip
    finally:
        faults = env.steps["kill9_qemu"] + env.steps["restart_node"]
        print(f"model test: {env.steps.total()} steps {dict(env.steps)}, {faults} faults "
              f"injected, {env.starts} node processes")
    if SEEDED:
        missing = [r for r in RULES if env.steps[r] == 0]
        assert not missing, f"seed {SHORT_SEED} ran no {missing}: {dict(env.steps)}"
