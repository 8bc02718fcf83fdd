"""Fixtures for the SDK checks. These run only inside the agent's network namespace, in
the pytest sub-session that ``tests/integration/guest/test_agent_sdk.py`` starts (files
are named ``check_*.py`` so the outer session does not collect them)."""

from __future__ import annotations

import base64
import os
import secrets
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import httpx
import pytest
from e2b import AsyncSandbox, Sandbox

from aenv.guest.agent.version import ENVD_VERSION
from tests.support.e2b_stub import ControlPlaneStub

AGENT_URL = os.environ.get("AENVT_AGENT_URL")
TOKEN = os.environ.get("AENVT_AGENT_TOKEN") or secrets.token_hex(16)
API_KEY = "aenvt-key"
SANDBOX_ENV = {"AENVT_SANDBOX_VAR": "from-init", "AENVT_SHADOWED": "sandbox"}


@pytest.fixture(scope="session")
def agent_url() -> str:
    if not AGENT_URL:
        pytest.skip("runs inside the agent's netns (see test_agent_sdk.py)")
    return AGENT_URL


@pytest.fixture(scope="session")
def token(agent_url: str) -> str:
    """POST /init as the node does: token, env vars, default user, clock, entropy."""
    r = httpx.post(
        agent_url + "/init",
        json={
            "accessToken": TOKEN,
            "envVars": SANDBOX_ENV,
            "defaultUser": "user",
            "timestamp": datetime.now(UTC).isoformat(),
            "aenvEntropy": base64.b64encode(secrets.token_bytes(64)).decode(),
        },
        timeout=10,
    )
    assert r.status_code == 204, r.text
    return TOKEN


@pytest.fixture(scope="session")
def stub(agent_url: str, token: str) -> Iterator[ControlPlaneStub]:
    with ControlPlaneStub(envd_version=ENVD_VERSION, envd_token=token, api_key=API_KEY) as s:
        os.environ.update(E2B_API_URL=s.url, E2B_SANDBOX_URL=agent_url, E2B_API_KEY=API_KEY)
        yield s


@pytest.fixture
def sbx(stub: ControlPlaneStub) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(timeout=120)
    yield sandbox
    sandbox.kill()


@pytest.fixture
async def asbx(stub: ControlPlaneStub) -> AsyncIterator[AsyncSandbox]:
    sandbox = await AsyncSandbox.create(timeout=120)
    yield sandbox
    await sandbox.kill()


@pytest.fixture
def workdir(sbx: Sandbox) -> str:
    """A fresh directory under /home/user, relative (so paths resolve against $HOME)."""
    name = "t-" + uuid.uuid4().hex[:10]
    assert sbx.files.make_dir(name)
    return name
