"""Real microVMs on this host's data directory (kernel and `base` built by `aenv setup`)."""

from __future__ import annotations

import os
import uuid

import pytest

from aenv import config as config_mod
from aenv.orchestrator.builder import build_template
from aenv.orchestrator.runtime import Runtime
from aenv.storage.templates import TemplateMissing

pytestmark = pytest.mark.vm


def _cfg() -> config_mod.Config:
    return config_mod.load()


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


@pytest.fixture(scope="session")
async def busybox_template(runtime):
    """A template whose rootfs holds nothing but busybox: the agent brings its own Python."""
    return await build_template(runtime, "busybox", "busybox", progress=lambda m: None)


@pytest.fixture
def sandbox_id() -> str:
    return "t" + uuid.uuid4().hex[:12]
