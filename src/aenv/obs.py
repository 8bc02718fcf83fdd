"""Observability: one-line key=value logs, per-stage timers, and the node's Prometheus metrics.

    log_event(log, "sandbox.created", sandbox_id=..., template=...)
    async with stage("create", "runtime_create", sandbox_id): ...

`stage` logs `stage op=... stage=... sandbox_id=... ms=... outcome=ok|error` at debug level
and observes `aenv_stage_seconds{op,stage,outcome}`. Op and stage names are closed sets
(metric labels); pass constants, never user input.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

STAGE_SECONDS = Histogram(
    "aenv_stage_seconds",
    "Duration of one lifecycle stage",
    ["op", "stage", "outcome"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
OPS_TOTAL = Counter("aenv_sandbox_ops_total", "Sandbox operations by outcome", ["op", "outcome"])
RL_OPS = Counter("aenv_rl_ops_total",
                 "RL plane operations (setup: a group's start state made; member: a group "
                 "member forked; evaluate: a verifier run in a fork) by outcome",
                 ["op", "outcome"])  # fmt: skip
SANDBOXES = Gauge("aenv_sandboxes", "Sandbox records by state", ["state"])
BOOTS_IN_FLIGHT = Gauge("aenv_boots_in_flight", "Creates currently booting a VM")
ADMISSION_WAIT = Histogram("aenv_admission_wait_seconds",
                           "How long a create or reboot waited for a boot slot",
                           buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 30, 60))
REJECTED_TOTAL = Counter("aenv_capacity_rejections_total", "Creates refused (429)", ["limit"])
PROXY_REQUESTS = Counter(
    "aenv_proxy_requests_total", "Data-plane requests by outcome", ["outcome"]
)
GATEWAY_REQUESTS = Counter(
    "aenv_gateway_requests_total", "Requests through a cluster gateway", ["route", "outcome"]
)
PROXY_OPEN = Gauge("aenv_proxy_open_streams", "Data-plane responses currently streaming")
POOLED_VMS = Gauge("aenv_pooled_vms", "Ready VMs in a pool (pools.py)", ["kind"])
# kind: "sandbox" (the sandbox is then removed), "warm_pool" or "primed_pool" (the pool
# replaces the VMM).
VMM_EXITS = Counter(
    "aenv_vmm_unexpected_exits_total",
    "VMM processes that ended without the node ending them (crash, OOM kill, kill by hand, "
    "guest poweroff or reboot)", ["kind"],
)  # fmt: skip
HOT_VMS = Gauge("aenv_hot_paused_vmms", "Paused sandboxes whose stopped VMM is kept (hot tier)")
HOT_RSS = Gauge("aenv_hot_paused_rss_bytes", "Resident memory of the hot tier's VMMs")
HOT_DEMOTIONS = Counter(
    "aenv_hot_demotions_total",
    "Hot-paused sandboxes made cold (their VMM ended), by why: age, budget, memory, pressure, "
    "shutdown", ["reason"],
)  # fmt: skip
SANDBOX_MEMORY = Gauge("aenv_sandbox_memory_bytes",
                       "Summed PSS of the running sandboxes' VMMs (shared pages once)")
RESUMES = Counter("aenv_resumes_total", "Resumes of paused sandboxes by tier", ["tier"])


# Where events of one sandbox (fields with a `sandbox_id`, INFO and above) also go, whatever
# the log level: each node's sandbox logs (orchestrator/sandbox_logs.py).
SANDBOX_EVENTS: list[Callable[[str, int, dict[str, Any]], None]] = []


def log_event(log: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    if log.isEnabledFor(level):
        log.log(level, event, extra={"kv": fields})
    if level >= logging.INFO and "sandbox_id" in fields:
        for sink in SANDBOX_EVENTS:
            sink(event, level, fields)


@contextlib.asynccontextmanager
async def stage(op: str, name: str, sandbox_id: str | None = None) -> AsyncIterator[None]:
    t0 = time.perf_counter()
    outcome = "error"
    try:
        yield
        outcome = "ok"
    finally:
        dt = time.perf_counter() - t0
        STAGE_SECONDS.labels(op, name, outcome).observe(dt)
        log_event(
            _stage_log, "stage", logging.DEBUG,
            op=op, stage=name, sandbox_id=sandbox_id, ms=round(dt * 1000, 3), outcome=outcome,
        )  # fmt: skip


_stage_log = logging.getLogger("aenv.stage")


def _fmt_value(v: Any) -> str:
    s = str(v)
    if s == "" or any(c in s for c in ' "=\n\t'):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return s


class KeyValueFormatter(logging.Formatter):
    """`ts=... level=info logger=aenv.x event=sandbox.created sandbox_id=...` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        parts = [
            f"ts={ts.replace('+00:00', 'Z')}",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"event={_fmt_value(record.getMessage())}",
        ]
        for k, v in getattr(record, "kv", {}).items():
            if v is not None:
                parts.append(f"{k}={_fmt_value(v)}")
        if record.exc_info:
            parts.append(f"exc={_fmt_value(self.formatException(record.exc_info))}")
        return " ".join(parts)


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True
    # Libraries' debug output is per-packet noise: below INFO only aenv's own lines pass.
    handler.addFilter(_own_debug_only)
    # httpx logs every request at INFO: for etcd (clusters), several a second per node.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _own_debug_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.INFO or record.name.startswith("aenv")
