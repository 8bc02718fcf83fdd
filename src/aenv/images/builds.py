"""E2B template builds on this node: requests, their state and logs, and the build runs.

A build runs in a jailed build VM, never on the host: a VM restored from the base (an image
made a template by `images.templates`, or an existing template), with the egress the node
config gives builds. Each step runs through the VM's agent; after each, the VM is
snapshotted into the step cache under a hash chain of the steps so far, so a later build
with the same prefix starts from that snapshot (`steps.chain`). `startCmd` is started and
`readyCmd` polled before the final snapshot, which becomes the template: sandboxes of it
start with the process running. Build records are JSON files; a node restart marks builds
it finds unfinished `error`, and no half-built template is ever in the catalog.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import secrets
import shlex
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from aenv.config import Config, MachineShape
from aenv.images import copying, stepgc
from aenv.images.agent import AgentError, BuildAgent
from aenv.images.context import ContextStore
from aenv.images.finalize import NotReady, build_egress, settle, start_and_wait
from aenv.images.stepcache import CacheEntry, StepCache, StepState
from aenv.images.steps import BuildSpec, Step, StepError, base_key, chain, resolve
from aenv.orchestrator.pending import PendingTemplates
from aenv.storage.files import write_json_atomic
from aenv.storage.snapshots import now_rfc3339

log = logging.getLogger(__name__)
TAIL_LINES = 10


class BuildNotFound(LookupError):
    pass


class BuildFailed(Exception):
    def __init__(self, message: str, step: str) -> None:
        super().__init__(message)
        self.step = step


@dataclass
class LogEntry:
    timestamp: str
    level: str
    message: str
    step: str | None = None


@dataclass
class Build:
    build_id: str
    template_id: str
    names: list[str]
    tags: list[str]
    shape: MachineShape
    status: str = "waiting"  # waiting, building, ready, error
    created_at: str = field(default_factory=now_rfc3339)
    logs: list[LogEntry] = field(default_factory=list)
    reason: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = self.shape.model_dump()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Build:
        d = dict(d)
        d["shape"] = MachineShape.model_validate(d["shape"])
        d["logs"] = [LogEntry(**x) for x in d.get("logs") or []]
        return cls(**d)


class Builds:
    """The node's template builds. `runtime` is the node's Runtime."""

    def __init__(self, cfg: Config, runtime: Any, contexts: ContextStore,
                 pending: PendingTemplates | None = None) -> None:
        self.cfg = cfg
        self.rt = runtime
        self.contexts = contexts
        # A create naming a template a build is making waits for it (orchestrator.pending).
        self.pending = pending if pending is not None else PendingTemplates(0)
        self.root = cfg.images_dir / "builds"
        self.root.mkdir(parents=True, exist_ok=True)
        self.cache = StepCache(cfg.images_dir / "step-cache")
        self._builds: dict[str, Build] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._copying: dict[str, set[str]] = {}  # build id -> the contexts its COPY steps use
        self._keys: dict[str, bytes] = {}  # build id -> its spec and shape's hash (joins)
        self._slots = asyncio.Semaphore(cfg.max_concurrent_builds)
        self._starting: set[str] = set()  # cached snapshots builds are starting from
        self._recover()
        stepgc.sweep(self.cache, self.rt.snapshots, self._in_use())

    # --- records ----------------------------------------------------------------------------

    def _recover(self) -> None:
        for p in self.root.glob("*.json"):
            try:
                b = Build.from_json(json.loads(p.read_text()))
            except (OSError, ValueError, TypeError, KeyError):
                continue
            if b.status in ("waiting", "building"):
                b.status = "error"
                b.reason = {"message": "the node restarted during the build", "step": "base"}
                self._save(b)
            self._builds[b.build_id] = b

    def _in_use(self) -> set[str]:
        return {t.snapshot_id for t in self.rt.catalog.list()} | self._starting

    def _save(self, b: Build) -> None:
        write_json_atomic(self.root / f"{b.build_id}.json", b.to_json())

    def get(self, template_id: str, build_id: str) -> Build:
        b = self._builds.get(build_id)
        if b is None or b.template_id != template_id:
            raise BuildNotFound(f"build {build_id} of template {template_id} not found")
        return b

    def request(self, template_id: str, names: list[str], tags: list[str],
                shape: MachineShape) -> Build:
        b = Build(str(uuid.uuid4()), template_id, names, tags, shape)
        self._builds[b.build_id] = b
        self._save(b)
        return b

    # --- tags -------------------------------------------------------------------------------

    def template(self, name: str) -> Any:
        """The catalog entry of `name`, with an E2B build id (a UUID) it keeps."""
        from aenv.machines.api import TemplateNotFound
        from aenv.storage.templates import TemplateMissing

        try:
            t = self.rt.catalog.get(name)
        except TemplateMissing:
            raise TemplateNotFound(f"template '{name}' not found") from None
        if not t.e2b_build_id:
            t.e2b_build_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"aenv:{t.snapshot_id}"))
        return t

    def tag(self, name: str, tag: str | None, tags: list[str]) -> Any:
        """`tags` move to the build `name:tag` names (the newest without a tag)."""
        from aenv.machines.api import TagNotFound
        from aenv.storage.templates import TemplateMissing

        t = self.template(name)
        try:
            gone = t.retag(tag, tags)
        except TemplateMissing:
            raise TagNotFound(name, tag or "") from None
        self.rt.catalog.put(t)
        self._drop(gone)
        return t

    def untag(self, name: str, tags: list[str]) -> None:
        t = self.template(name)
        gone = t.untag(tags)
        self.rt.catalog.put(t)
        self._drop(gone)

    def _drop(self, snapshot_ids: list[str]) -> None:
        """Earlier builds no tag names any more (sandboxes made from them keep their
        reflinked files)."""
        from aenv.storage.snapshots import SnapshotNotFound

        for sid in snapshot_ids:
            with contextlib.suppress(SnapshotNotFound):
                self.rt.snapshots.delete(sid)

    def _log(self, b: Build, message: str, level: str = "info", step: str | None = None) -> None:
        b.logs.append(LogEntry(now_rfc3339(), level, message, step))

    # --- runs -------------------------------------------------------------------------------

    def start(self, b: Build, spec: BuildSpec) -> None:
        if b.status != "waiting":
            raise StepError(f"build {b.build_id} was started already ({b.status})")
        spec.check()
        b.status = "building"  # at once: the SDK's build_in_background reads it right away
        self._save(b)
        key = hashlib.sha256(f"{spec.model_dump_json()}|{b.shape.model_dump_json()}".encode())
        leader = None if spec.force else next(
            (o for o in self._builds.values() if o.status == "building"
             and o.template_id == b.template_id and self._keys.get(o.build_id) == key.digest()
             and o.build_id in self._tasks), None)  # fmt: skip
        if leader is not None:  # the same template, steps and shape already building: join it
            log.info("build %s of %s joined build %s (tags %s)", b.build_id, b.template_id,
                     leader.build_id, b.tags)  # fmt: skip
            b.logs = leader.logs  # one log: the leader's entries, as they come
            work = self._follow(b, leader, self._tasks[leader.build_id])
        else:
            self._keys[b.build_id] = key.digest()
            self._copying[b.build_id] = {s.filesHash for s in spec.steps if s.filesHash}
            log.info("build %s of %s started (tags %s)", b.build_id, b.template_id, b.tags)
            work = self._run(b, spec)
        task = self._tasks[b.build_id] = asyncio.create_task(work)
        self.pending.track([*b.names, *(f"{n}:{t}" for n in b.names
                                        for t in [*b.tags, b.build_id])],
                           "build", lambda: _status(b), task)  # fmt: skip

    async def _follow(self, b: Build, leader: Build, task: asyncio.Task[None]) -> None:
        """A joined build ends as the build it joined; once ready, the template also
        carries its tags, and its build id names it too."""
        try:
            await asyncio.wait([task])  # not cancelled with this one
            b.status, b.reason = leader.status, leader.reason
            if b.status == "ready":
                t = self.template(b.template_id)
                gone = t.retag(None, b.tags)
                t.build_ids = [*t.build_ids, b.build_id][-16:]
                self.rt.catalog.put(t)
                self._drop(gone)
        except asyncio.CancelledError:
            b.status, b.reason = "error", {"message": "the build was cancelled", "step": "base"}
            raise
        finally:
            b.logs = list(b.logs)
            self._save(b)
            self._tasks.pop(b.build_id, None)

    async def cancel(self, b: Build) -> None:
        task = self._tasks.get(b.build_id)
        if task is None or task.done():
            raise StepError(f"build {b.build_id} is not running ({b.status})")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        for task in list(self._tasks.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self, b: Build, spec: BuildSpec) -> None:
        vm = f"build-{secrets.token_hex(4)}"
        try:
            if self._slots.locked():
                self._log(b, "Waiting for a free build slot (max_concurrent_builds="
                             f"{self.cfg.max_concurrent_builds})")  # fmt: skip
            async with self._slots:
                template = await self._build(b, spec, vm)
            self._replace(template)
            b.status = "ready"
            self._log(b, f"Template {b.template_id} is ready")
        except asyncio.CancelledError:
            b.status = "error"
            b.reason = {"message": "the build was cancelled", "step": "base"}
            raise
        except BuildFailed as e:
            b.status = "error"
            tail = [x.message for x in b.logs[-TAIL_LINES:]]
            b.reason = {"message": str(e), "step": e.step,
                        "logEntries": [asdict(x) for x in b.logs[-TAIL_LINES:]]}
            self._log(b, f"Build failed: {e}", "error", e.step)
            log.info("build %s of %s failed at %s: %s (%s)", b.build_id, b.template_id, e.step,
                     e, " | ".join(tail))  # fmt: skip
        except Exception as e:
            log.exception("build %s of %s failed", b.build_id, b.template_id)
            b.status = "error"
            b.reason = {"message": f"internal error: {type(e).__name__}: {e}", "step": "base"}
        finally:
            with contextlib.suppress(Exception):
                await self.rt.destroy(vm)
            self._save(b)
            self._tasks.pop(b.build_id, None)
            self._keys.pop(b.build_id, None)
            self._copying.pop(b.build_id, None)
            with contextlib.suppress(Exception):
                stepgc.evict(self.cache, self.rt.snapshots, self.cfg.step_cache_bytes,
                             self._in_use())  # fmt: skip
            try:
                gone = self.contexts.evict(self.cfg.build_contexts_bytes,
                                           set().union(*self._copying.values()))  # fmt: skip
                if gone:
                    log.info("build contexts evicted (past build_contexts_bytes): %s", gone)
            except OSError as e:
                log.warning("evicting build contexts failed: %s", e)

    def _replace(self, template: Any) -> None:
        """The new build becomes the template; the previous one stays as a version while it
        has tags the new one does not take (another CPU/memory variant), else its snapshot
        goes (sandboxes made from it keep their reflinked files)."""
        from aenv.storage.templates import TemplateMissing

        try:
            old = self.rt.catalog.get(template.name)
        except TemplateMissing:
            old = None
        gone = old.succeed(template) if old is not None else []
        self.rt.catalog.put(template)
        self._drop(gone)

    async def _base(self, b: Build, spec: BuildSpec) -> tuple[str, StepState]:
        """The template the build VM starts from, and the state its steps start in."""
        from aenv.images.registry import Credentials, RegistryError
        from aenv.images.templates import template_from_image

        if spec.fromTemplate:
            try:
                info = self.rt.template(spec.fromTemplate)
            except Exception:
                raise BuildFailed(f"template '{spec.fromTemplate}' not found", "base") from None
            if info.shape != b.shape:  # a snapshot keeps its machine: no hotplug on microvm
                self._log(b, f"the build keeps {spec.fromTemplate}'s machine shape "
                             f"({info.shape.vcpus} vCPU, {info.shape.memory_mib} MiB)",
                          "warn", "base")  # fmt: skip
            return info.template_id, StepState(dict(info.env), info.user or "user",
                                               info.workdir or "/home/user")  # fmt: skip
        assert spec.fromImage
        auth = spec.fromImageRegistry
        creds = (Credentials(auth.username or "", auth.password or "")
                 if auth is not None and auth.username else None)  # fmt: skip
        self._log(b, f"Pulling {spec.fromImage}", step="base")
        try:
            t = await template_from_image(self.rt, spec.fromImage, None, b.shape, creds,
                                          progress=lambda m: self._log(b, m, step="base"))
        except (RegistryError, ValueError) as e:
            raise BuildFailed(f"pulling {spec.fromImage} failed: {e}", "base") from None
        # E2B: after the base layer commands run as `user` in /home/user.
        return t.name, StepState(dict(t.env), "user", "/home/user")

    async def _build(self, b: Build, spec: BuildSpec, vm: str) -> Any:
        from aenv.machines.api import AgentInit
        from aenv.storage.templates import Template

        self._log(b, f"Building template {b.template_id} ({b.build_id})")
        base, state = await self._base(b, spec)
        key = base_key(self.rt.template(base).build_id)
        start_from, done = self.rt.template(base).build_id, 0  # snapshot ids from here on
        n = len(spec.steps)
        if not spec.force:
            for step in spec.steps:
                hit = None if step.force else self.cache.get(chain(key, step), touch=True)
                if hit is None or not self.rt.has_snapshot(hit.snapshot_id):
                    break
                key, start_from, state = chain(key, step), hit.snapshot_id, hit.state
                done += 1
                self._log(b, f"CACHED [{done}/{n}] {_describe(step)}", step=str(done))
        token = secrets.token_hex(16)
        init = AgentInit(access_token=token, env_vars=dict(state.env),
                         default_user=state.user, default_workdir=state.workdir,
                         egress=build_egress(self.cfg))  # fmt: skip
        self._starting.add(start_from)
        try:
            handle = await self.rt.create(vm, start_from, init)
        except Exception as e:
            raise BuildFailed(f"starting the build VM failed: {e}", "base") from None
        finally:
            self._starting.discard(start_from)
        agent = BuildAgent(handle.url(), token)
        try:
            for i in range(done, n):
                step = spec.steps[i]
                self._log(b, f"[{i + 1}/{n}] {_describe(step)}", step=str(i + 1))
                state = await self._step(b, agent, step, state, str(i + 1))
                key = chain(key, step)
                if step.type != "ENV":  # ENV changes no file: its entry shares the last one
                    start_from = f"{stepgc.PREFIX}{key[:24]}-{secrets.token_hex(3)}"
                    await self.rt.snapshot_build(vm, start_from, b.template_id)
                old = self.cache.put(key, CacheEntry(start_from, state))
                if old is not None:  # a forced rebuild replaced it
                    stepgc.release(self.cache, self.rt.snapshots, [old], self._in_use())
            await self._finalize(b, agent, spec, state)
            await settle(agent, lambda m: self._log(b, m, step="finalize"))
            await agent.forget_token()  # the build's token stays out of the template
            final = f"tpl-{b.template_id}-{b.build_id[:8]}-{secrets.token_hex(3)}"
            await self.rt.snapshot_build(vm, final, b.template_id)
        finally:
            await agent.close()
        return Template(
            name=b.template_id, recipe="build", shape=self.rt.template(base).shape,
            snapshot_id=final,
            build_key=key, created_at=now_rfc3339(), aliases=[],
            envd_version=self.rt.template(base).envd_version,
            source_image=spec.fromImage or f"template:{spec.fromTemplate}",
            env=dict(state.env), user=state.user, workdir=state.workdir,
            start_cmd=spec.startCmd, tags=list(b.tags), e2b_build_id=b.build_id,
        )  # fmt: skip

    async def _exec(self, b: Build, agent: BuildAgent, cmd: str, user: str, state: StepState,
                    step: str) -> None:
        """Run `cmd` as `user`; a non-zero exit fails the build, naming the step."""
        if await agent.run(f"id -u {_q(user)} >/dev/null 2>&1", user="root") != 0:
            raise BuildFailed(f"failed to run command '{cmd}': command failed: "
                              f"unauthenticated: invalid username: '{user}'", step)  # fmt: skip
        try:
            code = await agent.run(cmd, user=user, cwd=state.workdir, env=state.env,
                                   on_line=lambda ln: self._log(b, ln, step=step))  # fmt: skip
        except AgentError as e:
            raise BuildFailed(f"failed to run command '{cmd}': command failed: {e.code}: {e}",
                              step) from None  # fmt: skip
        if code != 0:
            tail = "; ".join(x.message for x in b.logs[-3:] if x.step == step)
            raise BuildFailed(f"failed to run command '{cmd}': exit code {code}"
                              + (f" (last output: {tail})" if tail else ""), step)

    async def _step(self, b: Build, agent: BuildAgent, step: Step, state: StepState,
                    where: str) -> StepState:
        if step.type == "RUN":
            user = step.args[1] if len(step.args) > 1 and step.args[1] else state.user
            await self._exec(b, agent, step.args[0], user, state, where)
            return state
        if step.type == "ENV":
            env = dict(state.env)
            env.update(zip(step.args[0::2], step.args[1::2], strict=True))
            return StepState(env, state.user, state.workdir)
        if step.type == "WORKDIR":
            path = resolve(step.args[0], state.workdir).rstrip("/") or "/"
            await self._exec(b, agent, f"mkdir -p {_q(path)}", "root", state, where)
            await self._exec(b, agent, f"chown {_q(state.user)} {_q(path)} 2>/dev/null || true",
                             "root", state, where)  # fmt: skip
            return StepState(state.env, state.user, path)
        if step.type == "USER":
            user = step.args[0]
            if await agent.run(f"id -u {_q(user)} >/dev/null 2>&1", user="root") != 0:
                await self._exec(b, agent, f"/.aenv/bin/busybox adduser -D {_q(user)}", "root",
                                 state, where)  # fmt: skip
            return StepState(state.env, user, state.workdir)
        # COPY
        assert step.filesHash is not None
        archive = self.contexts.path(step.filesHash)
        if not self.contexts.touch(step.filesHash):
            raise BuildFailed(f"COPY {step.args[0]}: its files were not uploaded "
                              f"(hash {step.filesHash})", where)  # fmt: skip
        try:
            await copying.copy_into(agent, archive, step, state,
                                    lambda m: self._log(b, m, step=where))  # fmt: skip
        except copying.CopyFailed as e:
            raise BuildFailed(str(e), where) from None
        return state

    async def _finalize(self, b: Build, agent: BuildAgent, spec: BuildSpec,
                        state: StepState) -> None:
        try:
            await start_and_wait(agent, spec.startCmd, spec.readyCmd, state,
                                 lambda m: self._log(b, m, step="finalize"))  # fmt: skip
        except NotReady as e:
            raise BuildFailed(str(e), "finalize") from None


def _status(b: Build) -> str:
    last = b.logs[-1].message if b.logs else b.status
    return f"build {b.build_id}: {last[:200]}"


def _q(s: str) -> str:
    return shlex.quote(s)


def _describe(step: Step) -> str:
    return f"{step.type} {' '.join(step.args)}".strip()

