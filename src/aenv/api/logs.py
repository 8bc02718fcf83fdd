"""A sandbox's logs, as E2B serves them (v1 and v2); what they hold is in
orchestrator/sandbox_logs.py."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request

from aenv.api import query
from aenv.api.auth import require_api_key, team_of
from aenv.api.models import (
    Error,
    SandboxLog,
    SandboxLogEntry,
    SandboxLogs,
    SandboxLogsV2Response,
)
from aenv.orchestrator.errors import NotFound
from aenv.orchestrator.sandbox_logs import LogEntry
from aenv.orchestrator.sandbox_logs import SandboxLogs as Store
from aenv.orchestrator.service import Orchestrator
from aenv.teams.model import DEFAULT_TEAM

MAX_LIMIT = 10_000

router = APIRouter(dependencies=[Depends(require_api_key)],
                   responses={s: {"model": Error} for s in (400, 401, 404, 500)})  # fmt: skip


async def _logs(request: Request, sandbox_id: str) -> Store:
    """The node's sandbox logs, if `sandbox_id` is one of its sandboxes or has a log here
    (a sandbox killed within the retention); else 404. A running sandbox's guest is asked
    for what it logged since the last read first."""
    orch: Orchestrator = request.app.state.orchestrator
    logs = orch.logs
    if orch.store.get(sandbox_id) is None:  # a live one's team was checked by require_api_key
        # An ended sandbox's log is its team's alone; one that ended before teams were
        # recorded is the default team's.
        owner = orch.store.ended_team(sandbox_id) or DEFAULT_TEAM
        if logs is None or owner != team_of(request) or not logs.has(sandbox_id):
            raise NotFound(f"sandbox '{sandbox_id}' not found")
    elif logs is None:
        raise NotFound(f"sandbox '{sandbox_id}' not found")
    await orch.pull_guest_logs(sandbox_id)
    return logs


def _entry(e: LogEntry) -> SandboxLogEntry:
    return SandboxLogEntry(timestamp=query.rfc3339(e.ts_us), message=e.message,
                           level=e.level, fields=e.fields)  # type: ignore[arg-type]  # fmt: skip


@router.get("/sandboxes/{sandbox_id}/logs", operation_id="getSandboxLogs")
async def logs_v1(
    request: Request, sandbox_id: str,
    start: Annotated[int | None, Query(ge=0, description="unix milliseconds")] = None,
    limit: Annotated[int, Query(ge=0, le=MAX_LIMIT)] = 1000,
) -> SandboxLogs:
    """Entries from `start` on, oldest first."""
    got = (await _logs(request, sandbox_id)).read(
        sandbox_id, cursor_us=start * 1000 if start is not None else None, limit=limit)
    return SandboxLogs(
        logs=[SandboxLog(timestamp=query.rfc3339(e.ts_us),
                         line=json.dumps({"level": e.level, "msg": e.message, **e.fields}))
              for e in got],
        logEntries=[_entry(e) for e in got])  # fmt: skip


@router.get("/v2/sandboxes/{sandbox_id}/logs", operation_id="getSandboxLogsV2")
async def logs_v2(
    request: Request, sandbox_id: str,
    cursor: Annotated[int | None, Query(ge=0, description="unix milliseconds")] = None,
    limit: Annotated[int, Query(ge=0, le=MAX_LIMIT)] = 1000,
    direction: Literal["forward", "backward"] = "forward",
    level: Literal["debug", "info", "warn", "error"] = "debug",
    search: Annotated[str | None, Query(max_length=256)] = None,
) -> SandboxLogsV2Response:
    """Forward: from `cursor` on, oldest first; backward: up to `cursor` (default now),
    newest first. `level`: that level and above; `search`: in the message or a field."""
    got = (await _logs(request, sandbox_id)).read(
        sandbox_id, cursor_us=cursor * 1000 + (999 if direction == "backward" else 0)
        if cursor is not None else None, limit=limit, direction=direction, min_level=level,
        search=search)  # fmt: skip
    return SandboxLogsV2Response(logs=[_entry(e) for e in got])
