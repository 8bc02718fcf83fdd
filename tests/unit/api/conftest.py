from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from e2b.api.client.client import AuthenticatedClient

from aenv.api.app import Node
from aenv.config import Config
from aenv.orchestrator.fake import FakeRuntime
from tests.support.asgi import serve  # noqa: F401 (re-exported)

KEY = "test-key-0123456789"


def make_config(tmp_path: Path, **kw: object) -> Config:
    base: dict[str, object] = dict(
        data_dir=tmp_path / "data", runtime="fake", api_key=KEY,
        ttl_sweep_interval_s=0.05, metrics_interval_s=0.2, transition_wait_s=5,
    )  # fmt: skip
    base.update(kw)
    return Config.model_validate(base)


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return make_config(tmp_path)


@pytest.fixture
async def node(config: Config, runtime: FakeRuntime) -> AsyncIterator[Node]:
    n = Node(config, runtime)
    await n.start()
    yield n
    await n.close()


@pytest.fixture
async def client(node: Node) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=node), base_url="http://aenv",
        headers={"X-API-Key": KEY},
    ) as c:  # fmt: skip
        yield c


@pytest.fixture
def sdk(node: Node) -> AuthenticatedClient:
    """The E2B SDK's own generated API client, on the in-process node."""
    c = AuthenticatedClient(base_url="http://aenv", token=KEY, prefix="",
                            auth_header_name="X-API-Key")  # fmt: skip
    c.set_async_httpx_client(httpx.AsyncClient(transport=httpx.ASGITransport(app=node),
                                               base_url="http://aenv",
                                               headers={"X-API-Key": KEY}))  # fmt: skip
    return c
