"""A running sandbox's metrics (sampled from its agent) and its guest's log (pulled from its
agent's journal), into the store and the sandbox's log.

The agent's numbers and lines are untrusted: each is parsed and range-checked here
(`agent_replies`), and a guest that does not answer in time gives nothing, not an error.
"""

from __future__ import annotations

import asyncio
import logging

from aenv.machines.agent_replies import AgentMetrics, GuestLogs
from aenv.obs import log_event
from aenv.orchestrator import background
from aenv.orchestrator.reachability import Reachability
from aenv.orchestrator.sandbox_logs import LogEntry
from aenv.orchestrator.states import SandboxState
from aenv.orchestrator.store import MetricSample, SandboxRecord

log = logging.getLogger("aenv.orchestrator")
S = SandboxState


class Observing:
    """Part of `Orchestrator` (orchestrator/service.py), whose state it uses."""

    reachability: Reachability

    def _start_cmd_of(self, rec: SandboxRecord) -> str | None:
        """The start command of the sandbox's template (the guest's journal holds its
        output), if it is a template here that has one."""
        try:
            return self.runtime.template(rec.template_id).start_cmd
        except Exception:
            return None

    async def pull_guest_logs(self, sandbox_id: str) -> int:
        """What the guest logged since the last pull, into the sandbox's log: the number of
        entries taken (0 too if it is not running or its agent does not answer)."""
        route = self.routes.get(sandbox_id)
        if route is None or self.logs is None or route.starting:
            return 0
        try:
            async with asyncio.timeout(background.SAMPLE_TIMEOUT_S):
                raw = await self.runtime.agent_logs(route.handle,
                                                    self.logs.guest_cursor(sandbox_id))
            got = GuestLogs.parse(raw)
        except Exception as e:
            log_event(log, "sandbox.guest_logs_failed", logging.DEBUG, sandbox_id=sandbox_id,
                      error=repr(e))  # fmt: skip
            return 0
        return self.logs.add_guest(sandbox_id, [
            LogEntry(e.tsUs, e.level, e.message, {**e.fields, "source": e.fields.get(
                "source", "guest")}) for e in got.entries], got.next)  # fmt: skip

    async def sample(self, sandbox_id: str) -> bool:
        """Take one metrics sample from the agent; False if it did not answer."""
        route = self.routes.get(sandbox_id)
        if route is None or route.starting:  # its /init is behind its start: not yet
            return False
        try:
            async with asyncio.timeout(background.SAMPLE_TIMEOUT_S):
                raw = await self.runtime.agent_metrics(route.handle)
            m = _metric_from_agent(raw, self.now_us())
        except Exception as e:
            log_event(log, "sandbox.metrics_failed", logging.DEBUG, sandbox_id=sandbox_id,
                      error=repr(e))  # fmt: skip
            if self.routes.get(sandbox_id) is route:  # not paused or replaced meanwhile
                self.reachability.missed(sandbox_id)
            return False
        self.reachability.answered(sandbox_id)
        return self.store.add_metric(sandbox_id, m)

    async def metrics(
        self, sandbox_id: str, start_us: int | None, end_us: int | None
    ) -> list[MetricSample]:
        """Samples in [start, end] (defaults: the sandbox's start, now). A window reaching the
        present gets a fresh sample if the last one is older than the sampling interval."""
        rec = self.get(sandbox_id)
        now = self.now_us()
        interval_us = int(self.config.metrics_interval_s * 1_000_000)
        if rec.state is not S.PAUSED and (end_us is None or end_us >= now - interval_us):
            last = self.store.last_metric_us(sandbox_id)
            if last is None or last < now - interval_us:
                await self.sample(sandbox_id)
        start = rec.started_at_us if start_us is None else start_us
        end = self.now_us() if end_us is None else end_us
        return self.store.metrics(sandbox_id, start, end)


def _metric_from_agent(raw: dict[str, object], now_us: int) -> MetricSample:
    """A sample from the guest's (untrusted) numbers: GuestReplyError unless each is in range.
    The timestamp is the node's own."""
    m = AgentMetrics.parse(raw)
    return MetricSample(
        ts_us=now_us, cpu_count=m.cpu_count, cpu_used_pct=m.cpu_used_pct,
        mem_used=m.mem_used, mem_total=m.mem_total, mem_cache=m.mem_cache,
        disk_used=m.disk_used, disk_total=m.disk_total,
    )
