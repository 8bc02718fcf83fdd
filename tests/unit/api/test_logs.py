"""A sandbox's logs (api/logs.py, orchestrator/sandbox_logs.py) on a fake node, read with the
SDK's generated client: what the node did to the sandbox, in order, filtered by level and
text, paged forward and backward, and still readable after the sandbox ended."""

from __future__ import annotations

import datetime
import time

import httpx
from e2b.api.client.api.sandboxes import (
    get_sandboxes_sandbox_id_logs,
    get_v_2_sandboxes_sandbox_id_logs,
)
from e2b.api.client.client import AuthenticatedClient
from e2b.api.client.models import LogLevel, LogsDirection, SandboxLogs, SandboxLogsV2Response

from aenv.orchestrator import sandbox_logs
from aenv.orchestrator.fake import FakeRuntime

from .test_control_plane import assert_error, create

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
MS = datetime.timedelta(milliseconds=1)


def _ms(stamp: datetime.datetime) -> int:
    """Exact unix milliseconds (a float product can round down by one)."""
    return (stamp - EPOCH) // MS



async def test_a_sandbox_log_tells_what_happened_to_it(
    client: httpx.AsyncClient, sdk: AuthenticatedClient
) -> None:
    sid = (await create(client, metadata={"k": "v"}))["sandboxID"]
    other = (await create(client))["sandboxID"]
    assert (await client.post(f"/sandboxes/{sid}/pause")).status_code == 204
    assert (await client.post(f"/sandboxes/{sid}/resume", json={})).status_code == 201
    assert (await client.delete(f"/sandboxes/{sid}")).status_code == 204

    v2 = await get_v_2_sandboxes_sandbox_id_logs.asyncio(sid, client=sdk)
    assert isinstance(v2, SandboxLogsV2Response), v2
    messages = [e.message for e in v2.logs]
    assert messages == ["sandbox.created", "sandbox.paused", "sandbox.resumed",
                        "sandbox.killed"], messages  # fmt: skip
    assert all(e.level == LogLevel.INFO for e in v2.logs)
    assert v2.logs[1].fields.additional_properties.get("reason") == "request"
    stamps = [e.timestamp.timestamp() for e in v2.logs]
    assert stamps == sorted(stamps) and abs(stamps[-1] - time.time()) < 30

    back = await get_v_2_sandboxes_sandbox_id_logs.asyncio(
        sid, client=sdk, direction=LogsDirection.BACKWARD, limit=2)
    assert [e.message for e in back.logs] == ["sandbox.killed", "sandbox.resumed"]
    # The cursor is in milliseconds, and on the fake runtime a pause and a resume can share
    # one: forward from the resume's millisecond gives every entry of it and after.
    cursor = _ms(v2.logs[2].timestamp)
    fwd = await get_v_2_sandboxes_sandbox_id_logs.asyncio(sid, client=sdk, cursor=cursor)
    later = [e.message for e in v2.logs if _ms(e.timestamp) >= cursor]
    assert [e.message for e in fwd.logs] == later and later[-2:] == messages[-2:], later
    found = await get_v_2_sandboxes_sandbox_id_logs.asyncio(sid, client=sdk, search="PAUSED")
    assert [e.message for e in found.logs] == ["sandbox.paused"]
    warn = await get_v_2_sandboxes_sandbox_id_logs.asyncio(sid, client=sdk,
                                                            level=LogLevel.WARN)  # fmt: skip
    assert warn.logs == []

    v1 = await get_sandboxes_sandbox_id_logs.asyncio(sid, client=sdk, limit=1)
    assert isinstance(v1, SandboxLogs), v1
    assert [e.message for e in v1.log_entries] == ["sandbox.created"]
    assert '"msg": "sandbox.created"' in v1.logs[0].line

    # Each sandbox's own: the other has its create only; an unknown id is 404.
    r = await client.get(f"/v2/sandboxes/{other}/logs")
    assert [e["message"] for e in r.json()["logs"]] == ["sandbox.created"]
    assert_error(await client.get("/v2/sandboxes/nope/logs"), 404)
    assert_error(await client.get(f"/v2/sandboxes/{sid}/logs", params={"level": "loud"}), 400)
    assert_error(await client.get(f"/sandboxes/{sid}/logs", params={"limit": -1}), 400)
    await client.delete(f"/sandboxes/{other}")


def test_retention_and_the_per_sandbox_bound(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sqlite3

    logs = sandbox_logs.SandboxLogs(sqlite3.connect(tmp_path / "l.db", isolation_level=None))
    monkeypatch.setattr(sandbox_logs, "MAX_PER_SANDBOX", 3)
    for i in range(5):
        logs.capture("e", 20, {"sandbox_id": "a", "i": i})
    logs.capture("e", 20, {"sandbox_id": "b"})
    logs.capture("ignored", 20, {"no": "sandbox"})
    assert logs.flush() == 6
    logs.prune(time.time_ns() // 1000)
    assert [e.fields["i"] for e in logs.read("a")] == ["2", "3", "4"]  # the newest kept
    logs.prune(time.time_ns() // 1000 + sandbox_logs.RETENTION_S * 1_000_000 + 10**6)
    assert not logs.has("a") and not logs.has("b")


async def test_what_the_guest_logged_is_read_once_and_a_bad_reply_is_left_out(
        client: httpx.AsyncClient, runtime: FakeRuntime) -> None:  # fmt: skip
    sid = (await client.post("/v2/sandboxes", json={"templateID": "base"})).json()["sandboxID"]
    line = {"tsUs": 1_700_000_000_000_000, "level": "info", "fields": {"source": "startCmd",
                                                                       "stream": "stdout"}}
    runtime.guest_logs[sid] = [{"seq": 1, "message": "server up", **line},
                               {"seq": 2, "message": "listening on 8080", **line}]
    for _ in range(2):  # read twice: each guest entry once
        r = await client.get(f"/v2/sandboxes/{sid}/logs", params={"search": "startcmd"})
        assert [e["message"] for e in r.json()["logs"]] == ["server up", "listening on 8080"]
    runtime.guest_logs[sid].append({"seq": 3, "message": "x" * 5000, **line})  # too long
    r = await client.get(f"/v2/sandboxes/{sid}/logs", params={"search": "startcmd"})
    assert r.status_code == 200 and len(r.json()["logs"]) == 2
    r = await client.get(f"/sandboxes/{sid}/logs")
    assert any('"msg": "server up"' in x["line"] for x in r.json()["logs"])
    assert (await client.delete(f"/sandboxes/{sid}")).status_code == 204
