"""Real microVMs on this host's data directory (kernel and `base` built by `aenv setup`).

The runtime runs as a node instance of its own, and the leak census of that instance is
checked after every test that used it: whatever is left must be a VM the runtime still runs
(its warm pool, or a sandbox the test keeps) or an idle slot. After the session the instance
is released (nothing of it may be left).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from aenv import config as config_mod
from aenv.machines.runtime import Runtime
from aenv.orchestrator.builder import build_template
from aenv.storage.templates import TemplateMissing
from tests.support import census

pytestmark = pytest.mark.vm


INSTANCE = os.environ.get("AENV_INSTANCE") or census.new_instance("i")


def _cfg() -> config_mod.Config:
    # No primed pool (tests/e2e/test_primed.py covers it): creates here are restores.
    return config_mod.load(instance=INSTANCE, primed_pool_size=0)


@pytest.fixture(scope="session")
def cfg() -> config_mod.Config:
    if os.geteuid() != 0:
        pytest.skip("VM tests need root")
    return _cfg()


@pytest.fixture(scope="session")
async def runtime(cfg):
    rt = Runtime(cfg)
    await rt.start()
    try:
        rt.catalog.get(cfg.default_template)
    except TemplateMissing:
        pytest.fail(f"template {cfg.default_template!r} missing: run `aenv setup` first")
    yield rt
    await rt.close()
    leaks = census.problems(cfg.instance, allow={"instdir"})
    if not os.environ.get("AENV_INSTANCE"):
        census.release(cfg.instance)
    assert not leaks, "left after the runtime closed:\n" + "\n".join(leaks)


@pytest.fixture(autouse=True)
def _census_after_test(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "runtime" not in request.fixturenames:
        return
    rt = request.getfixturevalue("runtime")
    # A VM the runtime runs is explained as a running sandbox's; the instance is live.
    running = {rt.cfg.instance: dict.fromkeys(rt.machines(), "running")}
    leaks = census.problems(rt.cfg.instance, records=running, live={rt.cfg.instance})
    assert not leaks, "left by this test:\n" + "\n".join(leaks)


@pytest.fixture(scope="session")
async def busybox_template(runtime):
    """A template whose rootfs holds nothing but busybox: the agent brings its own Python."""
    return await build_template(runtime, "busybox", "busybox", progress=lambda m: None)


@pytest.fixture
def sandbox_id() -> str:
    return "t" + uuid.uuid4().hex[:12]
