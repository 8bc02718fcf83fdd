"""Snapshots (take, find, list, delete) and forks (of a sandbox or of a named snapshot)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TypeVar

from aenv.machines.api import (
    SandboxHandle,
    SnapshotInfo,
    TagNotFound,
    TemplateInfo,
    TemplateNotFound,
)
from aenv.obs import OPS_TOTAL, log_event, stage
from aenv.orchestrator import memory_pressure, mounts
from aenv.orchestrator import snapshots as snaps
from aenv.orchestrator.errors import (
    CapacityExhausted,
    Forbidden,
    InvalidRequest,
    NotFound,
    ShuttingDown,
    StateConflict,
    Unsupported,
)
from aenv.orchestrator.images import ImageTemplates
from aenv.orchestrator.requests import (
    FALLBACK_ENVD_VERSION,
    FULL_RETRY_AFTER_S,
    MAX_FORK_COUNT,
    CreateRequest,
    agent_init,
    new_access_token,
    new_sandbox_id,
)
from aenv.orchestrator.states import HOLDS_CAPACITY, SandboxState
from aenv.orchestrator.store import SandboxRecord
from aenv.storage.recipes import RECIPES
from aenv.teams import names
from aenv.teams.model import DEFAULT_TEAM

log = logging.getLogger("aenv.orchestrator")
_T = TypeVar("_T")
S = SandboxState


class Forking:
    """Part of `Orchestrator` (orchestrator/service.py), whose state it uses."""

    images: ImageTemplates | None

    async def snapshot(self, sandbox_id: str, name: str | None = None, *,
                       memory: bool = True) -> SnapshotInfo:
        """Running -> Snapshotting -> Running: clone the sandbox into a new snapshot, usable
        as a templateID. The sandbox keeps running (it stops only while its state is saved).
        `memory=False`: filesystem-only, the disk alone; a create from it cold-boots."""
        names = snaps.check_name(name)
        async with self._locks.hold(sandbox_id):
            rec = self._running_for(sandbox_id, "a snapshot")
            self._admit(0, "take a snapshot", vms=0, boot=False, new=False)
            if not self.store.transition(sandbox_id, [S.RUNNING], S.SNAPSHOTTING, self.now_us()):
                raise StateConflict(f"sandbox {sandbox_id} changed state", actual=str(rec.state))
            snap_id = snaps.new_snapshot_id()
            t0 = time.perf_counter()
            try:
                async with stage("snapshot", "runtime_snapshot", sandbox_id):
                    info = await self.runtime.snapshot_sandbox(sandbox_id, snap_id, names,
                                                               memory=memory,
                                                               team_id=rec.team_id)
            except BaseException:
                OPS_TOTAL.labels("snapshot", "error").inc()
                raise
            finally:
                # The runtime lets the VM continue whatever happened.
                self.store.transition(sandbox_id, [S.SNAPSHOTTING], S.RUNNING, self.now_us())
            mounts.remember(self.store.db, snap_id, rec.volume_mounts)
            if self.shared is not None:
                self.shared.taken(info)
        OPS_TOTAL.labels("snapshot", "ok").inc()
        log_event(log, "snapshot.created", sandbox_id=sandbox_id, snapshot_id=snap_id,
                  mode="full" if memory else "filesystem",
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip
        return info

    def resolve_template(self, name: str, *, fetched: bool = False,
                         team_id: str | None = None) -> TemplateInfo:
        """A template by id or alias, else a snapshot by id, else the newest snapshot carrying
        `name`; TemplateNotFound (404) if none. `fetched`: a copy fetched from another node
        counts too (`_resolve` found it through the cluster). `team_id`: only what that team
        sees (its own templates first, then public ones; its own snapshots); None: all."""
        no_tag: TagNotFound | None = None  # the template is here, that tag is not
        for n in [name] if team_id is None else names.candidates(name, team_id):
            try:
                return self.runtime.template(n)
            except TagNotFound:
                base, _, tag = name.partition(":")
                no_tag = no_tag or TagNotFound(base, tag)  # in the caller's words
            except TemplateNotFound:
                pass
        try:
            snap = self.find_snapshot(name, fetched=fetched, team_id=team_id)
        except TemplateNotFound:
            if no_tag is not None:
                raise no_tag from None
            raise
        try:
            source = self.runtime.template(snap.template)
        except TemplateNotFound:
            source = None
        # Fetched with no template here: what its own node's template gave (its origin).
        o = snap.origin if source is None and snap.origin else {}
        env = dict(source.env) if source else dict(o.get("env") or {})  # type: ignore[call-overload]
        return TemplateInfo(
            template_id=snap.snapshot_id, aliases=list(snap.names), shape=snap.shape,
            envd_version=source.envd_version if source
            else str(o.get("envd_version") or FALLBACK_ENVD_VERSION),
            build_id=snap.snapshot_id, created_at=snap.created_at, env=env,
            user=source.user if source else o.get("user"),  # type: ignore[arg-type]
            workdir=source.workdir if source else o.get("workdir"),  # type: ignore[arg-type]
        )  # fmt: skip

    async def _resolve(self, name: str, team_id: str | None = None) -> TemplateInfo:
        """`resolve_template`, then the cluster: a snapshot another node or the snapshot
        store has is fetched here first. A template on its way (built, pulled, fetched) is
        waited for, within the node's bound (`pending`: 503 past it)."""
        try:
            info = await self._in_cluster(name, team_id, self.resolve_template)
        except TemplateNotFound:
            on_its_way = self.pending.find(names.candidates(name, team_id) if team_id
                                           else [name])  # fmt: skip
            if on_its_way is None:
                if name in RECIPES:  # a template aenv makes, not made here (yet)
                    raise TemplateNotFound(
                        f"template '{name}' is not built on this node: `aenv setup -t {name}` "
                        f"builds it (docs/templates.md)") from None
                if self.images is None or not self.images.is_image(name):
                    raise
                # No template of that name: an image reference, pulled on demand.
                return await self._resolve(await self.images.template_for(name, team_id),
                                           team_id)  # fmt: skip
            await self.pending.wait(on_its_way)
            info = await self._in_cluster(name, team_id, self.resolve_template)
        if info.fetched and self.shared is not None:
            self.shared.used(info.build_id)
        return info

    async def _in_cluster(self, name: str, team_id: str | None,
                          lookup: Callable[..., _T]) -> _T:  # fmt: skip
        """`lookup(name)` as the team sees it; if it is not here, the cluster's copy (fetched
        here first) looked up by id. TemplateNotFound (404) when neither has it."""
        try:
            return lookup(name, team_id=team_id)
        except TemplateNotFound:
            if self.shared is None:
                raise
            for n in [name] if team_id is None else names.candidates(name, team_id):
                sid = await self.shared.locate(n)
                if sid is not None:
                    return lookup(sid, fetched=True, team_id=team_id)
            raise

    def snapshot_list(self) -> list[SnapshotInfo]:
        """Every snapshot of this node that is not being deleted."""
        return self._snapshots()

    def _snapshots(self, team_id: str | None = None) -> list[SnapshotInfo]:
        """This node's own snapshots (the team's, if given): not those being deleted, nor
        copies it fetched."""
        return [s for s in self.runtime.list_snapshots()
                if not self._snap_refs.hidden(s.snapshot_id) and not s.fetched
                and team_id in (None, s.team_id)]  # fmt: skip

    def find_snapshot(self, name: str, *, fetched: bool = False,
                      team_id: str | None = None) -> SnapshotInfo:
        """By id, else the newest carrying `name`; TemplateNotFound (404). A copy fetched
        from another node is found only with `fetched` (by id: the cluster, which says
        whether it still exists, named it). `team_id`: only that team's (None: any)."""
        if not self._snap_refs.hidden(name):
            try:
                snap = self.runtime.snapshot_info(name)
                if (fetched or not snap.fetched) and team_id in (None, snap.team_id):
                    return snap
            except TemplateNotFound:
                pass
        return snaps.newest_named(self._snapshots(team_id), name)

    async def _find_shared(self, name: str, team_id: str | None = None) -> SnapshotInfo:
        """`find_snapshot`, then the cluster (fetched here if another node has it)."""
        return await self._in_cluster(name, team_id, self.find_snapshot)

    def list_snapshots(
        self, sandbox_id: str | None = None, name: str | None = None,
        limit: int = snaps.MAX_PAGE, cursor: tuple[int, str] | None = None,
        team_id: str | None = None,
    ) -> tuple[list[SnapshotInfo], tuple[int, str] | None]:
        listed = [s for s in self._snapshots(team_id) if not snaps.internal(s)]
        return snaps.page(listed, sandbox_id=sandbox_id, name=name,
                          limit=limit, cursor=cursor)  # fmt: skip

    def delete_snapshot(self, snapshot_id: str, team_id: str | None = None) -> None:
        """Gone from listings and lookups at once; its files go now, or when the last
        restore in flight from it has cloned them. NotFound (404). A template is deleted
        the same way (sandboxes and snapshots made from it keep their own files), except the
        node's default template (400). `team_id`: only that team's own (a public template
        is the default team's to delete: 403 for another)."""
        if self._snap_refs.hidden(snapshot_id):
            raise NotFound(f"snapshot '{snapshot_id}' not found")
        try:
            snap = self.runtime.snapshot_info(snapshot_id)
            mine = team_id in (None, snap.team_id)
        except TemplateNotFound:
            mine = False
        if mine:
            own = True
        else:
            info = self._deletable_template(snapshot_id, team_id)
            self.runtime.remove_template(info.template_id)
            snapshot_id = info.build_id  # the template's snapshot, deleted like any other
            own = not info.fetched  # a fetched copy's publication is its own node's
        if self._snap_refs.doom(snapshot_id):
            self._delete_snapshot_files(snapshot_id)
        if self.shared is not None and own:
            self.shared.deleted(snapshot_id)
        OPS_TOTAL.labels("snapshot_delete", "ok").inc()
        log_event(log, "snapshot.deleted", snapshot_id=snapshot_id,
                  deferred=self._snap_refs.hidden(snapshot_id))  # fmt: skip

    def _deletable_template(self, name: str, team_id: str | None) -> TemplateInfo:
        """The template `name` names for the team, if the team may delete it: NotFound,
        Forbidden (a public one, for another team), Unsupported (the node's default).
        `name:tag` names the whole template, every build of it."""
        name = name.partition(":")[0]
        for n in [name] if team_id is None else names.candidates(name, team_id):
            try:
                info = self.runtime.template(n)
                break
            except TemplateNotFound:
                pass
        else:
            raise NotFound(f"snapshot '{name}' not found")
        if team_id is not None and not names.owns(info.template_id, team_id):
            raise Forbidden(f"template '{name}' is public: only the default team removes it")
        if info.template_id == self.config.default_template:
            raise Unsupported(f"'{name}' is the node's default template: it is rebuilt or "
                              "removed with the aenv CLI")  # fmt: skip
        if not hasattr(self.runtime, "remove_template"):
            raise Unsupported(f"'{name}' is a template this runtime cannot remove")
        return info

    def _delete_snapshot_files(self, snapshot_id: str) -> None:
        try:
            self.runtime.delete_snapshot(snapshot_id)
        except TemplateNotFound:
            pass
        except Exception:
            log.exception("snapshot.delete_failed", extra={"kv": {"snapshot_id": snapshot_id}})

    # -- fork ------------------------------------------------------------------------------

    async def fork(
        self, sandbox_id: str, count: int, timeout_s: int | None = None
    ) -> list[SandboxRecord | BaseException | dict[str, object]]:
        """Snapshot the sandbox and start `count` children from it, each with its own id and
        token and the source's env, metadata and lifecycle. A running source keeps running
        (Forking meanwhile); a paused one, hot or cold, is forked from its paused state and
        stays Paused (its lock, held throughout, keeps a resume or kill out). One entry per
        child: its record, or the error that child failed with (children over max_sandboxes
        get CapacityExhausted)."""
        if isinstance(count, bool) or not 1 <= count <= MAX_FORK_COUNT:
            raise InvalidRequest(f"count must be between 1 and {MAX_FORK_COUNT}")
        if timeout_s is not None:
            self._check_timeout(timeout_s)
        async with contextlib.AsyncExitStack() as held, self._locks.hold(sandbox_id):
            src = self.get(sandbox_id)
            paused = src.state is S.PAUSED
            if not paused:
                src = self._running_for(sandbox_id, "a fork")
            await memory_pressure.relieve(self, count * src.memory_mib, count, keep=sandbox_id)
            self._refuse(new=True)
            await held.enter_async_context(self.team_hold(
                src.team_id, count, count * src.memory_mib, f"fork {count}"))
            self.admit_team(src.team_id, count, count * src.memory_mib, f"fork {count}")
            running = self.store.count(HOLDS_CAPACITY)
            room = max(0, self.config.max_sandboxes - running)
            n = self.memory.room(running=running, per_mib=src.memory_mib, want=min(count, room),
                                 nominal_mib=self.store.sum_memory_mib(HOLDS_CAPACITY))
            full = (f"the node is at its limit of {self.config.max_sandboxes} running sandboxes"
                    if n == room else "the node's memory budget holds no more sandboxes")
            self._admit_space(n * src.memory_mib, f"fork {n} sandboxes")
            ttl = src.timeout_s if timeout_s is None else timeout_s
            kids = [self._child_record(src, ttl) for _ in range(n)]
            # Children beyond this node's room go to other nodes of the cluster, restored
            # there from the fork's snapshot (fetched from here) while it exists.
            away = [self._child_record(src, ttl) for _ in range(count - n)] if (
                self.shared is not None and count > n) else []  # fmt: skip
            shared = self.shared
            elsewhere = None if not away or shared is None else (
                lambda snap: shared.fork_elsewhere(snap, away))  # fmt: skip
            for k in kids:
                self.store.insert(k)
            if (n or away) and not paused and not self.store.transition(
                    sandbox_id, [S.RUNNING], S.FORKING, self.now_us()):
                for k in kids:
                    self.store.delete(k.sandbox_id, [S.CREATING])
                raise StateConflict(f"sandbox {sandbox_id} changed state", actual=str(src.state))
            t0 = time.perf_counter()
            try:
                results: list[SandboxHandle | BaseException] = []
                if n or away:
                    inits = [(k.sandbox_id, agent_init(k, self.config.volumes_dir))
                             for k in kids]  # fmt: skip
                    async with stage("fork", "runtime_fork", sandbox_id):
                        results = await self.runtime.fork(sandbox_id, inits,
                                                          elsewhere=elsewhere)  # fmt: skip
            except BaseException:
                OPS_TOTAL.labels("fork", "error").inc()
                for k in kids:
                    self.store.delete(k.sandbox_id, [S.CREATING])
                raise
            finally:
                if (n or away) and not paused:
                    self.store.transition(sandbox_id, [S.FORKING], S.RUNNING, self.now_us())
            out: list[SandboxRecord | BaseException | dict[str, object]] = []
            for k, r in zip(kids, results[:n], strict=True):
                out.append(self._fork_child_started(k, r))
            out += results[n:]  # the children other nodes started (rendered there)
        out += [CapacityExhausted(full, retry_after_s=FULL_RETRY_AFTER_S)
                for _ in range(count - len(out))]
        ok = sum(isinstance(r, SandboxRecord) for r in out)
        OPS_TOTAL.labels("fork", "ok").inc(ok)
        log_event(log, "sandbox.forked", sandbox_id=sandbox_id, requested=count, started=ok,
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip
        return out

    async def fork_snapshot(self, snapshot: str, count: int, timeout_s: int,
                            team_id: str = DEFAULT_TEAM) -> list[SandboxRecord | BaseException]:
        """`count` sandboxes from a named snapshot (id or name) at once, as a fork's
        children: restored in parallel (at most max_concurrent_boots at a time), each with
        its own id, token and entropy. One entry per child, as `fork`."""
        if isinstance(count, bool) or not 1 <= count <= MAX_FORK_COUNT:
            raise InvalidRequest(f"count must be between 1 and {MAX_FORK_COUNT}")
        self._check_timeout(timeout_s)
        snap = await self._find_shared(snapshot, team_id)  # TemplateNotFound -> 404
        info = self.resolve_template(snap.snapshot_id, fetched=True)
        self._refuse(new=True)
        mib = info.shape.memory_mib
        async with self.team_hold(team_id, count, count * mib, f"create {count}"):
            self.admit_team(team_id, count, count * mib, f"create {count}")
            n = min(count, max(0, self.config.max_sandboxes - self.store.count(HOLDS_CAPACITY)))
            self._admit_space(n * mib, f"create {n} sandboxes")
            req = CreateRequest(template=snap.snapshot_id, timeout_s=timeout_s, team_id=team_id)
            egress = self.egress_for(None)
            kids = [dataclasses.replace(self._new_record(req, info, info.shape, egress),
                                        forked_from=snap.snapshot_id) for _ in range(n)]
            t0 = time.perf_counter()
            out: list[SandboxRecord | BaseException] = await self._children_from(
                snap.snapshot_id, kids)
        out += [CapacityExhausted(
            f"the node is at its limit of {self.config.max_sandboxes} running sandboxes",
            retry_after_s=FULL_RETRY_AFTER_S) for _ in range(count - n)]  # fmt: skip
        log_event(log, "snapshot.forked", snapshot_id=snap.snapshot_id, requested=count,
                  started=sum(isinstance(r, SandboxRecord) for r in out),
                  ms=round((time.perf_counter() - t0) * 1000, 1))  # fmt: skip
        return out

    async def _children_from(self, snapshot_id: str, kids: list[SandboxRecord]
                             ) -> list[SandboxRecord | BaseException]:  # fmt: skip
        """Start the children `kids` (records in Creating, inserted here) from a stored
        snapshot, side by side: one record or error each."""
        self._snap_refs.acquire(snapshot_id)  # a DELETE meanwhile waits for the clones
        try:
            for k in kids:
                self.store.insert(k)
            async with stage("fork", "runtime_children", snapshot_id):
                results = await self.runtime.create_children(
                    snapshot_id, [(k.sandbox_id, agent_init(k, self.config.volumes_dir))
                                  for k in kids])  # fmt: skip
        except BaseException:
            for k in kids:
                self.store.delete(k.sandbox_id, [S.CREATING])
            raise
        finally:
            if self._snap_refs.release(snapshot_id):
                self._delete_snapshot_files(snapshot_id)
        return [self._fork_child_started(k, r) for k, r in zip(kids, results, strict=True)]

    async def fork_children_here(self, snapshot_id: str, kids: list[SandboxRecord]
                                 ) -> list[SandboxRecord | BaseException]:  # fmt: skip
        """Children of a fork on another node that lacked room for them (their records made
        there, their snapshot fetched here): as many as this node holds, the rest refused."""
        self._refuse(new=True)
        room = max(0, self.config.max_sandboxes - self.store.count(HOLDS_CAPACITY))
        here = kids[:room]
        if here:
            self._admit_space(sum(k.memory_mib for k in here), f"fork {len(here)} sandboxes")
        out = await self._children_from(snapshot_id, here) if here else []
        return out + [CapacityExhausted(
            f"the node is at its limit of {self.config.max_sandboxes} running sandboxes",
            retry_after_s=FULL_RETRY_AFTER_S) for _ in kids[room:]]  # fmt: skip

    def _child_record(self, src: SandboxRecord, ttl_s: int) -> SandboxRecord:
        now = self.now_us()
        return SandboxRecord(
            sandbox_id=new_sandbox_id(), template_id=src.template_id, alias=src.alias,
            state=S.CREATING, started_at_us=now, end_at_us=now + ttl_s * 1_000_000,
            timeout_s=ttl_s, vcpus=src.vcpus, memory_mib=src.memory_mib,
            disk_mib=src.disk_mib, envd_version=src.envd_version,
            metadata=dict(src.metadata), env_vars=dict(src.env_vars),
            access_token=new_access_token() if src.access_token is not None else None,
            auto_pause=src.auto_pause, auto_resume=src.auto_resume,
            auto_pause_memory=src.auto_pause_memory,
            allow_internet=src.allow_internet, egress=src.egress, updated_at_us=now,
            # A child's ports are reached as its parent's, with a traffic token of its own.
            ingress=dataclasses.replace(src.ingress, traffic_token=new_access_token())
            if src.ingress.traffic_token is not None else src.ingress,
            default_user=src.default_user, default_workdir=src.default_workdir,
            volume_mounts=list(src.volume_mounts),  # the same volumes, live (not copies)
            team_id=src.team_id, forked_from=src.sandbox_id,
        )  # fmt: skip

    def _fork_child_started(
        self, kid: SandboxRecord, r: SandboxHandle | BaseException
    ) -> SandboxRecord | BaseException:
        sid = kid.sandbox_id
        if isinstance(r, BaseException):
            self.store.delete(sid, [S.CREATING])
            log_event(log, "sandbox.fork_child_failed", logging.WARNING, sandbox_id=sid,
                      error=repr(r))  # fmt: skip
            return r
        now = self.now_us()
        ok = self.store.transition(
            sid, [S.CREATING], S.RUNNING, now, started_at_us=now,
            end_at_us=now + kid.timeout_s * 1_000_000, slot_addr=r.slot_addr, vmm_pid=r.vmm_pid,
        )  # fmt: skip
        if not ok:
            return ShuttingDown("the node is shutting down")
        self.routes.add(r, kid.access_token, kid.ingress)
        return self.get(sid)

    # -- TTL -------------------------------------------------------------------------------
