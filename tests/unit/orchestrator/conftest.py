from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aenv.config import Config
from aenv.orchestrator.fake import FakeRuntime
from aenv.orchestrator.service import Orchestrator


def make_config(tmp_path: Path, **kw: object) -> Config:
    base: dict[str, object] = dict(
        data_dir=tmp_path / "data", runtime="fake", api_key="k",
        ttl_sweep_interval_s=0.05, metrics_interval_s=0.2, transition_wait_s=5,
    )  # fmt: skip
    base.update(kw)
    return Config.model_validate(base)


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
async def orch(tmp_path: Path, runtime: FakeRuntime) -> AsyncIterator[Orchestrator]:
    o = Orchestrator(make_config(tmp_path), runtime)
    await o.start()
    yield o
    await o.close()
