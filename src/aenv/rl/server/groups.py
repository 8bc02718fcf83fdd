"""Groups: N members forked from one prepared start state, joined by a key.

A trainer calls the sandbox layer once per sample; the samples of one prompt share a key
(verl's `uid`, SkyRL's instance id). The first call with a key makes the group: a sandbox
from the source, `setup` run there once, a snapshot (the start state), that sandbox ended.
Every call with the key then gets the next member, a fork of the start state; `n` members
are forked ahead so joins are instant, the rest on demand, in batches. No member ever runs
in the start state itself."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from aenv.obs import RL_OPS, log_event
from aenv.orchestrator import snapshots as snaps
from aenv.orchestrator.errors import InvalidRequest, NotFound, StateConflict
from aenv.orchestrator.requests import MAX_FORK_COUNT, CreateRequest
from aenv.orchestrator.routes import Route
from aenv.orchestrator.service import Orchestrator
from aenv.orchestrator.states import PUBLIC_STATE, SandboxState
from aenv.orchestrator.store import SandboxRecord
from aenv.rl.server.guest import CommandResult, FileSpec, Guest, GuestGone
from aenv.rl.server.leases import DEFAULT_LEASE_S, TIMEOUT_MARGIN_S, Lease, Leases
from aenv.rl.server.models import Command, GroupJoin, Setup, Source

log = logging.getLogger("aenv.rl")
S = SandboxState
_T = TypeVar("_T")
PARALLEL = 8  # group-wide commands and pauses at once
GROUP_PREFIX = "grp-"


def start_name(group_id: str) -> str:
    """The name of a group's start state (a snapshot of the RL plane's own)."""
    return snaps.INTERNAL_PREFIX + group_id


class SetupFailed(InvalidRequest):
    """The group's setup failed in its sandbox: the group was not made (400)."""


def member_state(rec: SandboxRecord | None) -> str:
    """running or paused (E2B's words), starting, or gone (ended, or ending)."""
    if rec is None or rec.state is S.KILLING:
        return "gone"
    return PUBLIC_STATE.get(rec.state, "starting")


@dataclass
class Member:
    sandbox_id: str
    index: int
    taken: bool = False
    replaced_from: str | None = None

    def to_json(self, rec: SandboxRecord | None) -> dict[str, object]:
        return {"sandboxID": self.sandbox_id, "index": self.index, "taken": self.taken,
                "state": member_state(rec),
                "replacedFrom": self.replaced_from}


@dataclass
class Group:
    group_id: str
    key: str
    team_id: str
    lease: Lease
    source: Source
    start_snapshot: str
    owns_snapshot: bool  # made for the group (deleted with it), not the caller's
    setup_s: float
    members: list[Member] = field(default_factory=list)
    joins: int = 0
    waiters: list[asyncio.Future[Member]] = field(default_factory=list)
    filler: asyncio.Task[None] | None = None
    ended: bool = False

    def next_free(self) -> Member | None:
        return next((m for m in self.members if not m.taken), None)


async def gather_limited(items: list[_T], fn: Callable[[_T], Awaitable[object]],
                         limit: int = PARALLEL) -> list[object]:  # fmt: skip
    """`fn` over `items`, at most `limit` at once: each result or its exception."""
    sem = asyncio.Semaphore(limit)

    async def one(x: _T) -> object:
        async with sem:
            return await fn(x)

    return list(await asyncio.gather(*(one(x) for x in items), return_exceptions=True))


class Groups:
    def __init__(self, orch: Orchestrator, leases: Leases) -> None:
        self.orch = orch
        self.leases = leases
        self._by_key: dict[tuple[str, str], Group] = {}
        self._by_id: dict[str, Group] = {}
        self._starting: dict[tuple[str, str], asyncio.Task[Group]] = {}

    def guest(self, route: Route, user: str) -> Guest:
        sid = route.sandbox_id
        return Guest(route, user, alive=lambda: self.orch.runtime.is_running(sid))

    # -- lookup ----------------------------------------------------------------------------

    def get(self, group_id: str, team_id: str) -> Group:
        g = self._by_id.get(group_id)
        if g is None or g.team_id != team_id or g.ended:
            raise NotFound(f"group \"{group_id}\" doesn't exist")
        return g

    def of_lease(self, lease: Lease) -> list[Group]:
        return [g for gid in lease.groups if (g := self._by_id.get(gid)) is not None]

    def view(self, g: Group) -> dict[str, object]:
        return {"groupID": g.group_id, "key": g.key, "leaseID": g.lease.lease_id,
                "source": {g.source.kind: g.source.ref}, "startSnapshotID": g.start_snapshot,
                "setupMs": round(g.setup_s * 1000, 1), "joins": g.joins,
                "members": [m.to_json(self.orch.store.get(m.sandbox_id)) for m in g.members]}

    # -- join ------------------------------------------------------------------------------

    async def join(self, team_id: str, body: GroupJoin) -> tuple[Group, Member, bool]:
        """The next member of the group of `body.key` (made by this call if none): the
        group, the member, and whether this call made the group."""
        k = (team_id, body.key)
        made = False
        g = self._by_key.get(k)
        if g is None:
            task = self._starting.get(k)
            if task is None:  # concurrent first calls wait on one start
                if body.source is None:
                    raise InvalidRequest(f"no group has key {body.key!r}: the call that "
                                         "makes it needs a source")  # fmt: skip
                task = asyncio.create_task(self._start(team_id, body), name="aenv-rl-start")
                self._starting[k] = task
                task.add_done_callback(lambda _t: self._starting.pop(k, None))
                made = True
            g = await asyncio.shield(task)
        g.joins += 1
        m = g.next_free()
        if m is not None:
            m.taken = True
            return g, m, made
        fut: asyncio.Future[Member] = asyncio.get_running_loop().create_future()
        g.waiters.append(fut)
        if g.filler is None or g.filler.done():
            g.filler = asyncio.create_task(self._fill(g), name=f"aenv-rl-fill-{g.group_id}")
        try:
            return g, await fut, made
        except BaseException:
            if fut in g.waiters:
                g.waiters.remove(fut)
            raise

    async def _fill(self, g: Group) -> None:
        """Fork members for the joins waiting, in batches (one restore pass per batch)."""
        while g.waiters and not g.ended:
            batch = g.waiters[:MAX_FORK_COUNT]
            got = await self.fork_members(g, len(batch))
            for fut, r in zip(batch, got, strict=True):
                g.waiters.remove(fut)
                if fut.done():  # its caller left: the member stays free for the next join
                    continue
                if isinstance(r, Member):
                    r.taken = True
                    fut.set_result(r)
                else:
                    fut.set_exception(r)

    async def fork_members(self, g: Group, count: int,
                           replaced_from: list[str] | None = None,
                           ) -> list[Member | BaseException]:  # fmt: skip
        """`count` new members forked from the start state (free, not taken)."""
        out: list[Member | BaseException] = []
        for at in range(0, count, MAX_FORK_COUNT):
            n = min(MAX_FORK_COUNT, count - at)
            try:
                kids = await self.orch.fork_snapshot(g.start_snapshot, n, self._timeout(g.lease),
                                                     g.team_id)  # fmt: skip
            except Exception as e:
                kids = [e] * n
            for i, r in enumerate(kids):
                if isinstance(r, SandboxRecord):
                    old = replaced_from[at + i] if replaced_from else None
                    m = Member(r.sandbox_id, len(g.members), replaced_from=old)
                    g.members.append(m)
                    out.append(m)
                    RL_OPS.labels("member", "ok").inc()
                else:
                    out.append(r)
                    RL_OPS.labels("member", "error").inc()
        if g.ended:  # ended meanwhile: what was just forked goes too
            await self._kill_all([m.sandbox_id for m in out if isinstance(m, Member)])
        return out

    @staticmethod
    def _timeout(lease: Lease) -> int:
        return int(max(0.0, lease.expires - time.monotonic()) + TIMEOUT_MARGIN_S)

    # -- the start state -------------------------------------------------------------------

    async def _start(self, team_id: str, body: GroupJoin) -> Group:
        assert body.source is not None
        own_lease = body.lease_id is None
        lease = (self.leases.new(team_id, body.lease_s if body.lease_s is not None
                                 else DEFAULT_LEASE_S) if own_lease
                 else self.leases.get(str(body.lease_id), team_id))  # fmt: skip
        gid = GROUP_PREFIX + secrets.token_hex(8)
        lease.groups.add(gid)
        t0 = time.monotonic()
        try:
            snap, owned = await self._start_state(team_id, gid, body.source, body.setup, lease)
        except BaseException:
            lease.groups.discard(gid)
            if own_lease:  # made for this group alone: it goes with it
                self.leases.remove(lease.lease_id)
            RL_OPS.labels("setup", "error").inc()
            raise
        RL_OPS.labels("setup", "ok").inc()
        g = Group(gid, body.key, team_id, lease, body.source, snap, owned,
                  time.monotonic() - t0)  # fmt: skip
        self._by_id[gid] = g
        self._by_key[(team_id, body.key)] = g
        log_event(log, "rl.group_made", group_id=gid, key=body.key, source=body.source.kind,
                  snapshot_id=snap, setup_ms=round(g.setup_s * 1000, 1))  # fmt: skip
        if lease.lease_id not in {le.lease_id for le in self.leases}:  # lapsed meanwhile
            await self.end(g)
            raise NotFound(f"lease \"{lease.lease_id}\" lapsed while the group was made")
        if body.n:
            await self.fork_members(g, body.n)
        return g

    async def _start_state(self, team_id: str, gid: str, source: Source,
                           setup: Setup | None, lease: Lease) -> tuple[str, bool]:
        """The snapshot members are forked from, and whether it was made for the group."""
        work = setup is not None and bool(setup.commands or setup.files)
        if source.kind == "snapshot" and not work:
            info = self.orch.find_snapshot(source.ref, team_id=team_id)  # 404 if none
            return info.snapshot_id, False
        if source.kind == "sandbox" and not work:
            rec = self.sandbox_of(source.ref, team_id)
            if rec.state is S.RUNNING:  # stopped only for the snapshot
                return (await self.orch.snapshot(rec.sandbox_id, start_name(gid))).snapshot_id, True
        prep = await self._prep_sandbox(team_id, source, lease)
        lease.sandboxes.add(prep.sandbox_id)
        try:
            if work:
                assert setup is not None
                await self._run_setup(prep, setup)
            return (await self.orch.snapshot(prep.sandbox_id, start_name(gid))).snapshot_id, True
        finally:
            lease.sandboxes.discard(prep.sandbox_id)
            with contextlib.suppress(NotFound):
                await self.orch.kill(prep.sandbox_id)

    def sandbox_of(self, sandbox_id: str, team_id: str) -> SandboxRecord:
        rec = self.orch.get(sandbox_id)
        if rec.team_id != team_id:
            raise NotFound(f"sandbox \"{sandbox_id}\" doesn't exist or you don't have access "
                           "to it")  # fmt: skip
        return rec

    async def _prep_sandbox(self, team_id: str, source: Source, lease: Lease) -> SandboxRecord:
        """A sandbox of the source to run the setup in."""
        ttl = self._timeout(lease) + 3600  # setup may outlast the lease's first period
        if source.kind in ("template", "image"):
            return await self.orch.create(CreateRequest(template=source.ref, timeout_s=ttl,
                                                        team_id=team_id))  # fmt: skip
        if source.kind == "sandbox":
            self.sandbox_of(source.ref, team_id)
            got = await self.orch.fork(source.ref, 1, ttl)
        else:
            got = await self.orch.fork_snapshot(source.ref, 1, ttl, team_id)
        if isinstance(got[0], BaseException):
            raise got[0]
        assert isinstance(got[0], SandboxRecord)
        return got[0]

    async def _run_setup(self, rec: SandboxRecord, setup: Setup) -> None:
        route = self.orch.routes.get(rec.sandbox_id)
        if route is None:
            raise StateConflict(f"the setup sandbox {rec.sandbox_id} is not running")
        user = setup.user or rec.default_user or "user"
        deadline = time.monotonic() + setup.timeout
        cwd = setup.cwd or rec.default_workdir
        async with self.guest(route, user) as guest:
            await guest.write([FileSpec(f.path, f.data()) for f in setup.files])
            for i, step in enumerate(setup.steps()):
                left = deadline - time.monotonic()
                try:
                    r = await guest.run(step.cmd, timeout_s=max(0.1, left), cwd=cwd,
                                        env=setup.envs, background=step.background)
                except TimeoutError:
                    raise SetupFailed(f"setup timed out after {setup.timeout:g} s in "
                                      f"command {i}: {step.cmd[:200]}") from None
                if r.exit_code not in (0, -1):  # -1: a background command, started
                    raise SetupFailed(f"setup command {i} exited {r.exit_code}: "
                                      f"{step.cmd[:200]}; stderr: {r.stderr[-2000:]}")

    # -- group-wide operations -------------------------------------------------------------

    async def exec_all(self, g: Group, c: Command) -> list[dict[str, object]]:
        """`c` on every running member at once (PARALLEL at a time): one result each."""
        members = [m for m in g.members]

        async def one(m: Member) -> dict[str, object]:
            base: dict[str, object] = {"sandboxID": m.sandbox_id, "index": m.index}
            route = self.orch.routes.get(m.sandbox_id)
            rec = self.orch.store.get(m.sandbox_id)
            if route is None or rec is None or rec.state is not S.RUNNING:
                return base | {"error": "not running"}
            try:
                async with self.guest(route, c.user or rec.default_user or "user") as guest:
                    r: CommandResult = await guest.run(c.cmd, timeout_s=c.timeout,
                                                       cwd=c.cwd or rec.default_workdir,
                                                       env=c.envs)  # fmt: skip
            except TimeoutError:
                return base | {"error": f"timed out after {c.timeout:g} s"}
            except GuestGone as e:
                return base | {"error": str(e)}
            except Exception as e:  # the agent refused it (a missing cwd, ...)
                return base | {"error": str(e) or type(e).__name__}
            return base | r.to_json()

        got = await gather_limited(members, one)
        return [r if isinstance(r, dict) else {"error": repr(r)} for r in got]

    async def each(self, g: Group, op: str) -> list[dict[str, object]]:
        """Pause, resume or kill every member: one `{sandboxID, ok, error?}` each."""
        async def one(m: Member) -> dict[str, object]:
            if op == "pause":
                await self.orch.pause(m.sandbox_id)
            elif op == "resume":
                await self.orch.resume(m.sandbox_id, self._timeout(g.lease))
            else:
                await self.orch.kill(m.sandbox_id)
            return {"sandboxID": m.sandbox_id, "ok": True}

        got = await gather_limited(list(g.members), one)
        return [r if isinstance(r, dict) else
                {"sandboxID": m.sandbox_id, "ok": False, "error": str(r) or repr(r)}
                for m, r in zip(g.members, got, strict=True)]  # fmt: skip

    async def replace_failed(self, g: Group) -> list[dict[str, object]]:
        """Members whose sandbox is gone (its VMM died, it was killed) get a new fork in
        their place (same index, `replacedFrom` the old id)."""
        dead = [m for m in g.members if member_state(self.orch.store.get(m.sandbox_id)) == "gone"]
        if not dead:
            return []
        got = await self.fork_members(g, len(dead), [m.sandbox_id for m in dead])
        out: list[dict[str, object]] = []
        for old, new in zip(dead, got, strict=True):
            if isinstance(new, Member):
                g.members.remove(new)  # appended by fork_members: it takes the old place
                new.index, new.taken = old.index, old.taken
                g.members[g.members.index(old)] = new
                out.append({"old": old.sandbox_id, "new": new.sandbox_id, "index": old.index})
            else:
                out.append({"old": old.sandbox_id, "error": str(new) or repr(new)})
        log_event(log, "rl.members_replaced", group_id=g.group_id, replaced=len(out))
        return out

    async def end(self, g: Group) -> None:
        """Kill every member, delete a start state made for the group, forget it."""
        g.ended = True
        for fut in g.waiters:
            if not fut.done():
                fut.set_exception(NotFound(f"group \"{g.group_id}\" ended"))
        g.waiters.clear()
        if g.filler is not None and not g.filler.done():
            with contextlib.suppress(BaseException):
                await g.filler
        await self._kill_all([m.sandbox_id for m in g.members])
        if g.owns_snapshot:
            with contextlib.suppress(NotFound):
                self.orch.delete_snapshot(g.start_snapshot)
        self._by_id.pop(g.group_id, None)
        if self._by_key.get((g.team_id, g.key)) is g:
            del self._by_key[(g.team_id, g.key)]
        g.lease.groups.discard(g.group_id)
        log_event(log, "rl.group_ended", group_id=g.group_id, members=len(g.members))

    async def _kill_all(self, sandbox_ids: list[str]) -> None:
        async def one(sid: str) -> None:
            with contextlib.suppress(NotFound):
                await self.orch.kill(sid)

        for r in await gather_limited(sandbox_ids, one):
            if isinstance(r, BaseException):
                log.warning("rl.kill_failed", extra={"kv": {"error": repr(r)}})

    async def discard(self, g: Group, m: Member) -> None:
        """A member used once (a run-code call): killed and forgotten, so a group that
        serves calls for hours does not keep a list of them."""
        with contextlib.suppress(ValueError):
            g.members.remove(m)
        await self._kill_all([m.sandbox_id])

    async def kill_sandboxes(self, sandbox_ids: list[str]) -> None:
        await self._kill_all(sandbox_ids)

    async def close(self) -> None:
        for g in list(self._by_id.values()):
            await self.end(g)
