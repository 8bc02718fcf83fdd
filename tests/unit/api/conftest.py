from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from aenv.api.app import Node
from aenv.config import Config
from aenv.orchestrator.fake import FakeRuntime

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


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@contextlib.asynccontextmanager
async def serve(app: Any) -> AsyncIterator[int]:
    """Run an ASGI app under a real uvicorn on a free loopback port (lifespan off)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = _QuietServer(uvicorn.Config(
        app, lifespan="off", log_config=None, access_log=False, timeout_graceful_shutdown=1,
    ))  # fmt: skip
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        await task
