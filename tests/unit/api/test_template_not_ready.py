"""A create naming a template that is not ready yet (being built, pulled or fetched) waits for
it, up to `template_wait_s`, then answers 503 with Retry-After and the work's status; listings
show it as `building` (orchestrator/pending.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from aenv.api.app import Node
from aenv.config import MachineShape
from aenv.machines.api import TemplateInfo
from aenv.orchestrator.fake import FakeRuntime

from .conftest import KEY, make_config


def _template(name: str) -> TemplateInfo:
    return TemplateInfo(template_id=name, aliases=[name], shape=MachineShape(),
                        envd_version="0.6.4", build_id=f"b-{name}", created_at="")  # fmt: skip


async def _node(tmp_path: Path, wait_s: float) -> tuple[Node, FakeRuntime, httpx.AsyncClient]:
    rt = FakeRuntime()
    node = Node(make_config(tmp_path, template_wait_s=wait_s), rt)
    await node.start()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=node), base_url="http://aenv",
                               headers={"X-API-Key": KEY}, timeout=30)  # fmt: skip
    return node, rt, client


async def test_a_create_waits_for_the_template_then_gets_503_with_retry_after(
    tmp_path: Path,
) -> None:
    node, rt, client = await _node(tmp_path, wait_s=0.5)
    try:
        with node.orchestrator.pending.making(["slow"], "build", lambda: "step 2/3: RUN make"):
            t0 = time.monotonic()
            r = await client.post("/v2/sandboxes", json={"templateID": "slow"})
            waited = time.monotonic() - t0
            assert r.status_code == 503, r.text
            assert r.headers["Retry-After"] == "10"
            body = r.json()
            assert set(body) == {"code", "message"} and body["code"] == 503
            assert "'slow' is not ready yet" in body["message"]
            assert "step 2/3: RUN make" in body["message"]
            assert waited >= 0.5
            # Listed as building, in the node's default shape.
            listed = {t["templateID"]: t for t in (await client.get("/templates")).json()}
            assert listed["slow"]["buildStatus"] == "building"
            assert listed["slow"]["source"] == "step 2/3: RUN make"
        assert node.orchestrator.pending.all() == []
        # Nothing of the refused create is left.
        assert (await client.get("/v2/sandboxes")).json() == []
        assert rt.live == {}
        # Ended without a template: 404, not a wait.
        t0 = time.monotonic()
        r = await client.post("/v2/sandboxes", json={"templateID": "slow"})
        assert r.status_code == 404 and time.monotonic() - t0 < 0.4
    finally:
        await client.aclose()
        await node.close()


async def test_a_create_that_waits_gets_the_template_once_it_is_made(tmp_path: Path) -> None:
    node, rt, client = await _node(tmp_path, wait_s=10)
    try:
        pending = node.orchestrator.pending

        async def build() -> None:
            with pending.making(["made"], "build", lambda: "booting"):
                await asyncio.sleep(0.3)
                rt._templates.append(_template("made"))

        task = asyncio.create_task(build())
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        r = await client.post("/v2/sandboxes", json={"templateID": "made"})
        assert r.status_code == 201, r.text
        assert 0.2 < time.monotonic() - t0 < 5
        assert r.json()["templateID"] == "made"
        await task
        # A template nobody makes is 404 at once, whatever is pending.
        with pending.making(["other"], "pull", lambda: "pulling"):
            r = await client.post("/v2/sandboxes", json={"templateID": "nothing"})
            assert r.status_code == 404
    finally:
        await client.aclose()
        await node.close()
