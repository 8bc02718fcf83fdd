"""The orchestrator's background loops: the TTL sweeper, the metrics sampler, the removal
of sandboxes whose VMM exited on its own, and the snapshot checksum worker and scrubber."""

from __future__ import annotations

import asyncio
import logging
import time

from aenv.machines.api import VmmExit
from aenv.obs import log_event
from aenv.orchestrator import memory_pressure
from aenv.orchestrator.errors import NotFound, StateConflict
from aenv.orchestrator.node import Node
from aenv.orchestrator.states import SandboxState
from aenv.storage.checksums import Pacer
from aenv.storage.snapshots import SnapshotCorrupt, SnapshotNotFound, SnapshotStore, Verification

log = logging.getLogger("aenv.orchestrator")

# One agent /metrics call may take this long before the sample is skipped.
SAMPLE_TIMEOUT_S = 2.0
# Agents asked at once per round: under TCG an agent's first /metrics after a restore costs
# seconds of CPU (its code is translated afresh), and 64 at once starved the /init of the
# sandboxes a burst was still starting.
SAMPLES_AT_ONCE = 4
SKIP_WHILE_STARTING = 6
# Samples older than this are dropped.
METRICS_RETENTION_S = 3600
LOGS_PRUNE_EVERY_S = 60.0
# How often the checksum worker looks at the store's queue of new snapshots (an in-memory
# deque: polling it costs nothing, and the worker needs no hook in the snapshot path).
CHECKSUM_POLL_S = 0.5
# A sandbox whose VMM died while another operation holds it is looked at again this often.
VMM_EXIT_RECHECK_S = 0.2
MIB = 1 << 20


async def ttl_sweeper(orch: Node) -> None:
    """Every `ttl_sweep_interval_s`, kill each Running sandbox whose endAt has passed."""
    interval = orch.config.ttl_sweep_interval_s
    while True:
        await asyncio.sleep(interval)
        try:
            for sid in orch.store.expired(SandboxState.RUNNING, orch.now_us()):
                if sid in orch._expiring:
                    continue
                orch._expiring.add(sid)
                task = asyncio.create_task(_expire(orch, sid), name=f"aenv-expire-{sid}")
                task.add_done_callback(lambda _t, sid=sid: orch._expiring.discard(sid))
        except Exception:
            log.exception("ttl.sweep_failed")


async def _expire(orch: Node, sandbox_id: str) -> None:
    try:
        await orch.expire(sandbox_id)
    except Exception:
        log.exception("ttl.expire_failed", extra={"kv": {"sandbox_id": sandbox_id}})


async def reap_dead_vmm(orch: Node, sandbox_id: str, how: VmmExit) -> None:
    """Remove a sandbox whose VMM exited on its own, as a kill does (`orch.remove_dead`).
    It never queues on the sandbox's lock: an operation in flight (kill, pause, snapshot,
    fork, a create or resume failing on the dead VM) finishes first and decides, then the
    state it left is looked at. A concurrent kill request joins this one (or this joins
    it): one removal. Gives up when the node closes (shutdown ends every VM anyway)."""
    try:
        while not orch._closing:
            if orch._started and not orch._locks.locked(sandbox_id):
                try:
                    done = await orch._joiner.run(sandbox_id, "kill",
                                                  lambda: orch.remove_dead(sandbox_id, how))
                except NotFound:
                    return  # joined a kill request that found it gone
                except StateConflict:
                    done = False  # joined a kill request that waited too long
                if done is not False:
                    return
            await asyncio.sleep(VMM_EXIT_RECHECK_S)
    except Exception:
        log.exception("sandbox.remove_dead_failed", extra={"kv": {"sandbox_id": sandbox_id}})


async def metrics_sampler(orch: Node) -> None:
    """Every `metrics_interval_s`, sample each running sandbox's agent /metrics."""
    interval = orch.config.metrics_interval_s
    pruned = 0.0
    skipped = 0
    while True:
        await asyncio.sleep(interval)
        try:
            ids = [r.sandbox_id for r in orch.routes]
            orch.reachability.keep_only(ids)
            # Not while sandboxes start (up to SKIP_WHILE_STARTING rounds in a row): under
            # TCG an agent's first answers cost seconds of CPU, which a burst's /inits need
            # more (their deadline is the user's create).
            busy = orch.boots.in_flight or any(r.starting for r in orch.routes)
            if busy and skipped < SKIP_WHILE_STARTING:
                skipped += 1
            elif ids:
                skipped = 0
                await _sample_all(orch, ids)
            await memory_pressure.measure(orch)
            orch.store.prune_metrics(orch.now_us() - METRICS_RETENTION_S * 1_000_000)
            if orch.logs is not None:  # the sandbox logs' queue, written here too
                orch.logs.flush()
                if time.monotonic() - pruned > LOGS_PRUNE_EVERY_S:
                    orch.logs.prune(orch.now_us())
                    pruned = time.monotonic()
        except Exception:
            log.exception("metrics.sample_failed")
        else:
            log_event(log, "metrics.sampled", logging.DEBUG, sandboxes=len(ids))


async def _sample_all(orch: Node, ids: list[str]) -> None:
    at_once = asyncio.Semaphore(SAMPLES_AT_ONCE)

    async def one(sid: str) -> None:
        async with at_once:
            await orch.sample(sid)

    await asyncio.gather(*(one(sid) for sid in ids))


async def idle_reclaimer(orch: Node) -> None:
    """Hand back the memory of running sandboxes with no data-plane request in flight, none
    for `reclaim_idle_s` and a quiet guest (its VMM's CPU, memory_pressure.IDLE_CPU) (the
    runtime's pager), once per idle spell. A sandbox an operation holds is left for the
    next round."""
    idle_s = orch.config.reclaim_idle_s
    if idle_s <= 0 or memory_pressure.pager_of(orch) is None:
        return
    while True:
        await asyncio.sleep(max(0.5, idle_s / 4))
        now = time.monotonic()
        for route in list(orch.routes):
            memory_pressure.note_cpu(orch, route, now)
            if memory_pressure.reclaimable(orch, route, idle_s, now):
                await memory_pressure.reclaim(orch, route, "idle")


def _snapshot_store(orch: Node) -> SnapshotStore | None:
    """The runtime's snapshot repository (the fake runtime has none: nothing to hash)."""
    store = getattr(orch.runtime, "snapshots", None)
    return store if isinstance(store, SnapshotStore) else None


async def snapshot_checksums(orch: Node) -> None:
    """Compute each new snapshot's chunk checksums after the call that took it returned
    (never on the snapshot, pause or resume path); at start, those of snapshots that lack
    theirs (built before checksums existed, by the CLI, or the node stopped mid-hash).
    One snapshot at a time, at full speed on one thread."""
    store = _snapshot_store(orch)
    if store is None:
        return
    pacer = Pacer()
    try:
        queued = await asyncio.to_thread(store.queue_missing)
        if queued:
            log_event(log, "snapshot.checksums_missing", count=len(queued))
        while True:
            sid = store.next_pending()
            if sid is None:
                await asyncio.sleep(CHECKSUM_POLL_S)
                continue
            t0 = time.perf_counter()
            try:
                done = await asyncio.to_thread(store.compute_checksums, sid, pacer)
            except SnapshotNotFound:
                continue  # deleted meanwhile: its directory went with whatever we wrote
            except (SnapshotCorrupt, OSError) as e:
                log_event(log, "snapshot.checksums_failed", logging.WARNING, snapshot_id=sid,
                          error=str(e))  # fmt: skip
                continue
            if done:
                log_event(log, "snapshot.checksummed", snapshot_id=sid,
                          ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip
    finally:
        pacer.stop.set()  # a hashing thread still running stops at its next chunk


async def scrubber(orch: Node) -> None:
    """Every `scrub_interval_s` (0: never), re-verify every stored snapshot's chunks at no
    more than `scrub_rate_mib_s`; a mismatch marks the snapshot unusable."""
    store = _snapshot_store(orch)
    interval = orch.config.scrub_interval_s
    if store is None or interval <= 0:
        return
    pacer = Pacer()
    try:
        while True:
            await asyncio.sleep(interval)
            # A new pacer per pass, sharing the stop event: the idle interval is no credit.
            pacer = Pacer(rate=orch.config.scrub_rate_mib_s * MIB, stop=pacer.stop)
            await scrub(store, pacer)
    finally:
        pacer.stop.set()


async def scrub(store: SnapshotStore, pacer: Pacer) -> list[Verification]:
    """One pass over the store: verify each snapshot not already marked corrupt."""
    out: list[Verification] = []
    t0 = time.perf_counter()
    for sid in await asyncio.to_thread(store.list):
        if store.corrupt_reason(sid) is not None:
            continue
        try:
            v = await asyncio.to_thread(store.verify, sid, pacer)
        except SnapshotNotFound:
            continue  # deleted meanwhile
        except (SnapshotCorrupt, OSError) as e:
            log_event(log, "snapshot.scrub_failed", logging.WARNING, snapshot_id=sid,
                      error=str(e))  # fmt: skip
            continue
        if v.status == "corrupt":
            log_event(log, "snapshot.corrupt", logging.ERROR, snapshot_id=sid, reason=v.detail)
        out.append(v)
    log_event(log, "snapshot.scrubbed", ok=sum(v.status == "ok" for v in out),
              corrupt=sum(v.status == "corrupt" for v in out),
              unverified=sum(v.status == "unverified" for v in out),
              mib_read=round(pacer.bytes_read / MIB, 1),
              s=round(time.perf_counter() - t0, 1))  # fmt: skip
    return out
