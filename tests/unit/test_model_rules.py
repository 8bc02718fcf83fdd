"""tests/e2e/test_model.py's CI run (its fixed seed, its short sizes) runs every rule of the
model: shown here against a fake node, in a second, without VMs.

Which rules the seeded run takes depends on hypothesis' choices alone: every choice hangs on
the model's state (which rules are enabled, how many sandboxes to pick from), never on what
the node answers, as long as every step passes. So the fake node (it answers every call with
success) takes the real run's path, and a change to the model, its preconditions or its sizes
that leaves a rule out (or a hypothesis upgrade that draws differently) fails here first,
with the rule to look at; the e2e test asserts the same of its own run.
"""

from __future__ import annotations

import importlib
import types
import uuid
from collections import Counter
from typing import Any

import pytest
from hypothesis import seed, settings
from hypothesis.stateful import run_state_machine_as_test

model = importlib.import_module("tests.e2e.test_model")


class _Anything:
    """What the fake node lists: equal to the model's view, holding no sandbox."""

    def __eq__(self, other: object) -> bool:
        return True

    def __iter__(self) -> Any:
        return iter(())

    def __contains__(self, item: object) -> bool:
        return False


class _FakeSandbox:
    def __init__(self) -> None:
        self.sandbox_id = uuid.uuid4().hex[:20]  # random, as the node's are
        self.files = types.SimpleNamespace(write=lambda *a, **k: None)
        self.commands = types.SimpleNamespace(run=lambda *a, **k: types.SimpleNamespace(pid=1))

    @classmethod
    def create(cls, **_: Any) -> _FakeSandbox:
        return cls()

    @classmethod
    def connect(cls, _sid: str, **_: Any) -> _FakeSandbox:
        return cls()

    @staticmethod
    def kill(_sid: str) -> bool:
        return True

    @staticmethod
    def delete_snapshot(_snap: str) -> bool:
        return True

    def pause(self) -> bool:
        return True

    def fork(self, count: int, **_: Any) -> list[_FakeSandbox]:
        return [_FakeSandbox() for _ in range(count)]

    def create_snapshot(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(snapshot_id=uuid.uuid4().hex)


class _FakeEnv:
    def __init__(self) -> None:
        self.steps: Counter[str] = Counter()
        self.node = types.SimpleNamespace(proc=types.SimpleNamespace(poll=lambda: None))
        self.instance = "fake"

    def start(self) -> None:
        pass

    def restart(self) -> None:
        pass

    def listed(self) -> _Anything:
        return _Anything()

    def census(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(vmm_pids=lambda instance, sid: [1], records={})


def _seeded_run(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    env = _FakeEnv()
    monkeypatch.setattr(model, "Sandbox", _FakeSandbox)
    monkeypatch.setattr(model, "_assert_intact", lambda b: None)
    monkeypatch.setattr(model, "os", types.SimpleNamespace(kill=lambda pid, sig: None))
    clean = types.SimpleNamespace(clean=True, lines=lambda: [])
    monkeypatch.setattr(model, "census_mod", types.SimpleNamespace(diff=lambda c: clean))
    monkeypatch.setattr(model.NodeModel, "env", env, raising=False)
    short = settings(model.SETTINGS, max_examples=model.SHORT_EXAMPLES,
                     stateful_step_count=model.SHORT_STEPS)  # fmt: skip
    run_state_machine_as_test(seed(model.SHORT_SEED)(model.NodeModel), settings=short)
    return env.steps


def test_the_seeded_model_run_exercises_every_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = _seeded_run(monkeypatch)
    missing = [r for r in model.RULES if steps[r] == 0]
    assert not missing, (f"seed {model.SHORT_SEED} no longer runs {missing} ({dict(steps)}): "
                         "choose another SHORT_SEED in tests/e2e/test_model.py")  # fmt: skip


def test_the_seeded_model_run_is_the_same_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sandbox ids differ from run to run: the path must not."""
    assert _seeded_run(monkeypatch) == _seeded_run(monkeypatch)
