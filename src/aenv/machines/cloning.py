"""VMs from stored state: restores (into warm-pool QEMUs), snapshots and the
repository, forks, primed VMs, and the template catalog."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aenv.config import MachineShape
from aenv.faults import fault
from aenv.machines import agent_replies, guest_warm
from aenv.machines.api import (
    AGENT_PORT,
    AgentInit,
    SandboxHandle,
    SnapshotInfo,
    TagNotFound,
    TemplateInfo,
    TemplateNotFound,
)
from aenv.machines.init_gate import InitGate
from aenv.machines.machine import (
    AGENT_BOOT_TIMEOUT,
    FORK_PREFIX,
    POOL_PREFIX,
    BootError,
    Machine,
    UnusableSnapshot,
    info_of_snapshot,
)
from aenv.storage.extents import tree_usage
from aenv.storage.files import clone, fsync_path, remove_tree
from aenv.storage.snapshots import (
    Manifest,
    SnapshotCorrupt,
    SnapshotNotFound,
    SnapshotUnusable,
    check_restorable,
    now_rfc3339,
)
from aenv.storage.templates import TemplateMissing
from aenv.teams.model import DEFAULT_TEAM
from aenv.vmm import ram
from aenv.vmm.base import Accel

log = logging.getLogger(__name__)

class Cloning:
    """Part of `Runtime` (machines/runtime.py), whose state it uses."""

    init_gate: InitGate

    # -- templates --------------------------------------------------------------------
    def templates(self, *, usage: bool = False) -> list[TemplateInfo]:
        """With `usage`, each template's bytes, own and shared (FIEMAP: for listings)."""
        out = []
        for t in self.catalog.list():
            info = self._template_info(t.name)
            if usage:
                use = tree_usage(self.snapshots.path(t.snapshot_id)) + tree_usage(
                    self.catalog.dir(t.name))
                info = dataclasses.replace(info, size_bytes=use.total, shared_bytes=use.shared)
            out.append(info)
        return out

    def template(self, name_or_id: str) -> TemplateInfo:
        return self._template_info(name_or_id)

    def _template_info(self, name: str) -> TemplateInfo:
        # "name:tag": a tag of its newest build or of an earlier one kept for its tags, or
        # a build's id (E2B's SDK and Harbor create from `name:<build id>`). An earlier
        # build is created from as its snapshot (its id is the info's id).
        base, _, tag = name.partition(":")
        try:
            t = self.catalog.get(base)
        except TemplateMissing:
            raise TemplateNotFound(f"template {name!r} not found") from None
        v = t.version(tag)
        if v is None:
            raise TagNotFound(base, tag)
        return TemplateInfo(
            template_id=t.name if v is t else v.snapshot_id, aliases=[t.name, *t.aliases],
            shape=v.shape, envd_version=v.envd_version,
            build_id=v.snapshot_id, created_at=v.created_at,
            size_bytes=v.rootfs_bytes, env=dict(v.env), user=v.user, workdir=v.workdir,
            source=v.source_image or f"recipe:{v.recipe}", fetched=t.fetched is not None,
            start_cmd=v.start_cmd,
        )  # fmt: skip

    async def restore(self, name: str, snapshot_id: str | None) -> Machine:
        """Start a VM from a snapshot's files, or, with snapshot_id None, from the state a
        pause left in the VM's own directory. A pre-spawned QEMU from the warm pool is used
        when one matches: the files are cloned into the ones it already has open."""
        man = self.paused_manifest(name) if snapshot_id is None else self._manifest(snapshot_id)
        src_dir = self.cfg.sandboxes_dir / name if snapshot_id is None else self.snapshots.path(
            snapshot_id)
        try:
            check_restorable(src_dir, man)
        except SnapshotUnusable as e:
            raise UnusableSnapshot(f"cannot restore: {e}") from e
        warm = self._pool.take(self._pool_key(man))
        if warm is not None:
            return await self._restore_warm(name, man, src_dir, warm, paused=snapshot_id is None)
        slot, workdir = await self._prepare(name, fresh=snapshot_id is not None)
        spec = self._spec(slot, workdir, man.shape, Path(man.kernel), Path(man.tools),
                          man.cmdline)
        t0 = time.perf_counter()
        try:
            if snapshot_id is not None:
                # One inode for every VM of the snapshot: one page cache (vmm/ram.py).
                ram.place(src_dir / "memory", spec.memory_file)
                clone(src_dir / "disk", workdir / "disk")
            else:
                ram.readable(spec.memory_file)
            self._own(workdir / "disk", slot.tap_uid)
            t1 = time.perf_counter()
            vm = await self.driver.spawn(spec, incoming=True)
        except BaseException:
            await self._release(slot, workdir if snapshot_id is not None else None)
            raise
        m = Machine(name, vm, slot, workdir, man.template, jail=name)
        self._register(m)
        try:
            if snapshot_id is None and (workdir / ram.BASE_NAME).exists():
                # Its own written pages over the base it shares with its snapshot's VMs.
                await asyncio.to_thread(ram.remap, vm.pid, spec.memory_file)
            t2 = time.perf_counter()
            fault("create.before_restore" if snapshot_id is not None else "resume.before_restore")
            await vm.restore(src_dir / "state")
            if snapshot_id is None:
                # From `cont` on the guest changes these very files: the paused state stops
                # being valid, so it must stop being found (a crash must not resume it).
                await asyncio.to_thread(self._forget_paused, workdir)
            await vm.resume()
            t3 = time.perf_counter()
        except BaseException:
            if snapshot_id is None:
                await self._stop(m)  # keep the paused files: the sandbox stays resumable
            else:
                await self.destroy(name)
            raise
        log.debug("restore %s: clone=%.1fms spawn=%.1fms load+cont=%.1fms", name,
                  (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)
        return m

    async def _restore_warm(self, name: str, man: Manifest, src_dir: Path, warm: Machine,
                            *, paused: bool) -> Machine:
        t0 = time.perf_counter()
        final = self.cfg.sandboxes_dir / name
        try:
            await self._place_ram(warm, src_dir / "memory")
            # FICLONE into the disk file the pooled QEMU has open: its owner and mode stay
            # the jail's.
            await asyncio.to_thread(clone, src_dir / "disk", warm.workdir / "disk")
            t1 = time.perf_counter()
            fault("resume.before_restore" if paused else "create.before_restore")
            await warm.vm.restore(src_dir / "state")
            await warm.vm.resume()
        except BaseException:
            await self._destroy(warm)
            raise
        t2 = time.perf_counter()
        # The sandbox's directory is now the pooled one, reached through a symlink named
        # after the sandbox: QEMU reopens its drives by path (block (in)activation around
        # migrations), so the real directory must keep its name. A paused sandbox's old
        # files go.
        await asyncio.to_thread(remove_tree, final)
        final.symlink_to(warm.workdir.name)
        m = Machine(name, warm.vm, warm.slot, final, man.template, jail=warm.jail,
                    http=warm.http)
        self._register(m)
        log.debug("restore %s (warm): clone=%.1fms load+cont=%.1fms", name,
                  (t1 - t0) * 1e3, (t2 - t1) * 1e3)
        return m

    async def _place_ram(self, m: Machine, src: Path) -> None:
        """A pooled (incoming, never run) VMM maps `src`, a snapshot's RAM file, in place
        of its empty one."""
        spec = m.vm.spec
        await asyncio.to_thread(ram.place, src, spec.memory_file)
        await asyncio.to_thread(ram.remap, m.vm.pid, spec.memory_file)

    def _manifest_of(self, m: Machine, snapshot_id: str, parent: str | None = None,
                     names: list[str] | None = None) -> Manifest:
        spec = m.vm.spec
        return Manifest(
            snapshot_id=snapshot_id, shape=spec.shape, kernel=str(spec.kernel),
            tools=str(spec.drives[0].path), cmdline=spec.cmdline, template=m.template_id,
            parent=parent, names=names or [],
        )

    async def snapshot(self, name: str, manifest: Manifest, *, resume: bool = True,
                       checksums: bool = True) -> None:
        """Clone a running machine into the snapshot repository. The VM is stopped only
        while its device state is saved and its files are cloned. Chunk checksums (not for
        a transient snapshot) are computed later, in the background. A filesystem-only
        manifest (`memory` false) takes the disk alone, after the guest flushed it."""
        m = self._machines[name]
        await self._settled(m)
        state = m.workdir / "state"
        if not manifest.memory:
            await self._flush_guest(m, strict=False)
        try:
            if manifest.memory:
                await self._save(m, state)  # the VMM goes on: rebased onto its RAM file
            else:
                await m.vm.pause()  # stop vCPUs: nothing more reaches the disk
                await asyncio.to_thread(fsync_path, m.workdir / "disk")
            await asyncio.to_thread(
                self.snapshots.put, manifest,
                {"state": state, "memory": m.workdir / "memory", "disk": m.workdir / "disk"},
                checksums=checksums,
            )
            fault("snapshot.after_put")
        finally:
            if resume:
                await m.vm.resume()

    async def _spawn_incoming(self, key: tuple[object, ...]) -> Machine:
        """One `-incoming defer` QEMU for a machine key with its slot and sparse, empty RAM
        and disk files (the warm pool's VMs)."""
        shape, kernel, tools, cmdline = key
        assert isinstance(shape, MachineShape)
        name = f"{POOL_PREFIX}{secrets.token_hex(4)}"
        slot, workdir = await self._prepare(name)
        spec = self._spec(slot, workdir, shape, Path(str(kernel)), Path(str(tools)),
                          str(cmdline))
        try:
            for f, size in (("memory", shape.memory_mib), ("disk", shape.disk_mib)):
                with open(workdir / f, "wb") as fh:
                    fh.truncate(size << 20)
                self._own(workdir / f, slot.tap_uid)
            vm = await self.driver.spawn(spec, incoming=True)
        except BaseException:
            await self._release(slot, workdir)
            raise
        return Machine(name, vm, slot, workdir, "", jail=name)

    async def prime(self, snapshot_id: str) -> Machine:
        """A VM restored from `snapshot_id`, run until its agent has answered `/health` and
        an identity-less `/init` (clock and entropy only), then stopped: the primed pool's.
        Under TCG the first requests after a restore pay for translating the guest code
        they run (`bench/snapshots.py --first-request`); a primed VM has paid already, and
        has run a shell as a first command would (`guest_warm`). It has run nothing of the
        template's own but its agent; the sandbox's own `/init` reseeds it and sets its
        token."""
        man = self._manifest(snapshot_id)
        src = self.snapshots.path(snapshot_id)
        check_restorable(src, man)
        m = await self._spawn_incoming(self._pool_key(man))
        try:
            await self._place_ram(m, src / "memory")
            await asyncio.to_thread(clone, src / "disk", m.workdir / "disk")
            await m.vm.restore(src / "state")
            await m.vm.resume()
            url = m.slot.url(AGENT_PORT)
            # A token of its own while it is warmed; the sandbox's /init replaces (or clears)
            # it. Templates built before builds dropped theirs still hold a token.
            token = secrets.token_hex(24)
            warm_init = {"timestamp": now_rfc3339(), "accessToken": token,
                         "aenvEntropy": base64.b64encode(secrets.token_bytes(64)).decode()}
            for method, path, body in (("GET", "/health", None), ("POST", "/init", warm_init)):
                r = await agent_replies.request(m.http, method, url + path, json=body,
                                                deadline_s=AGENT_BOOT_TIMEOUT)
                if r.status >= 300:
                    raise BootError(f"agent {path} answered {r.status}: {r.snippet()}")
            warmed = False
            if self.cfg.prime_warm and self.driver.accel() == Accel.TCG:
                warmed = await guest_warm.warm(m.http, url, token)
            await m.vm.pause()
            log.debug("primed %s from %s (warmed: %s)", m.name, snapshot_id, warmed)
        except BaseException:
            await self._destroy(m)
            raise
        m.template_id = man.template
        return m

    async def _continue_primed(self, name: str, primed: Machine) -> Machine:
        """Make a primed VM sandbox `name`: its directory is reached through a symlink
        named after the sandbox (as a warm restore's is), and its vCPUs continue."""
        final = self.cfg.sandboxes_dir / name
        try:
            await asyncio.to_thread(remove_tree, final)
            final.symlink_to(primed.workdir.name)
        except BaseException:
            await self._destroy(primed)
            raise
        m = Machine(name, primed.vm, primed.slot, final, primed.template_id, jail=primed.jail,
                    http=primed.http)
        self._register(m)
        fault("create.before_restore")
        await m.vm.resume()
        log.debug("create %s: primed VM %s continued", name, primed.name)
        return m

    async def _boot_snapshot(self, name: str, snapshot_id: str) -> Machine:
        """A new VM from a filesystem-only snapshot: a clone of its disk, cold-booted with
        the kernel, tools drive, command line and shape it was taken with."""
        man = self._manifest(snapshot_id)
        src = self.snapshots.path(snapshot_id)
        try:
            check_restorable(src, man)
        except SnapshotUnusable as e:
            raise UnusableSnapshot(f"cannot boot: {e}") from e
        slot, workdir = await self._prepare(name)
        try:
            await asyncio.to_thread(clone, src / "disk", workdir / "disk")
        except BaseException:
            await self._release(slot, workdir)
            raise
        return await self._boot_disk(name, man.template, slot, workdir, man.shape,
                                     Path(man.kernel), Path(man.tools), man.cmdline,
                                     keep_dir=False)  # fmt: skip

    async def fork(self, name: str, children: list[tuple[str, AgentInit]], *,
                   elsewhere: Callable[[str], Awaitable[list[Any]]] | None = None,
                   ) -> list[Any]:
        """Snapshot `name` and restore one child per entry, each with its own identity,
        token, env and entropy. A running sandbox keeps running; a paused one (hot or cold)
        is forked from its paused state on disk and stays paused."""
        snap_id = f"{FORK_PREFIX}{name}-{secrets.token_hex(4)}"
        m = self._machines.get(name)
        if m is not None:
            await self.snapshot(name, self._manifest_of(m, snap_id, parent=name),
                                checksums=False)  # fmt: skip
        else:
            await self.fsyncs.wait(name)
            await asyncio.to_thread(self._snapshot_paused, name, snap_id)
        fault("fork.after_snapshot")
        try:
            if elsewhere is None:
                return await self.create_children(snap_id, children)
            here, away = await asyncio.gather(self.create_children(snap_id, children),
                                              elsewhere(snap_id))  # fmt: skip
            return [*here, *away]
        finally:
            # Children hold reflinked copies: the fork snapshot itself is not kept.
            with contextlib.suppress(SnapshotNotFound):
                await asyncio.to_thread(self.snapshots.delete, snap_id)

    async def create_children(self, snapshot_id: str, children: list[tuple[str, AgentInit]]
                              ) -> list[SandboxHandle | BaseException]:
        """One VM per entry from a snapshot (a fork's, or a named one), each with its own
        identity: one result per child, its handle or why it failed."""
        await self.pager.make_room(len(children) * self._manifest(snapshot_id).shape.memory_mib)
        # All children restore at once (a restore is mostly I/O and QMP); their /init, which
        # under TCG pays for translating the agent's code, runs behind the call, at most
        # max_concurrent_boots at a time on the node (16 forks at once included): a crowd
        # only competes for the same CPUs and misses the /init deadline. The data plane
        # holds a child's requests until its /init is done.
        gate = self.init_gate

        async def child(cid: str, init: AgentInit) -> SandboxHandle:
            handle = await self._create_from(cid, snapshot_id, init, init_gate=gate)
            fault("fork.after_child")
            return handle

        return list(await asyncio.gather(*(child(cid, init) for cid, init in children),
                                         return_exceptions=True))  # fmt: skip

    def _snapshot_paused(self, name: str, snapshot_id: str) -> None:
        """A snapshot of a paused sandbox's state on disk (reflink clones; its stopped VMM,
        if hot, is untouched: the pause made its files whole)."""
        workdir = self.cfg.sandboxes_dir / name
        man = self.paused_manifest(name)
        man.memory = self.paused_with_memory(name)
        try:
            check_restorable(workdir, man)
        except SnapshotUnusable as e:
            raise UnusableSnapshot(f"cannot fork: {e}") from e
        man.snapshot_id, man.parent, man.names, man.created_at = snapshot_id, name, [], ""
        self.snapshots.put(man, {f: workdir / f for f in man.files}, checksums=False)

    async def snapshot_sandbox(self, name: str, snapshot_id: str, names: list[str], *,
                               memory: bool = True, team_id: str = DEFAULT_TEAM) -> SnapshotInfo:
        m = self._machines[name]
        man = self._manifest_of(m, snapshot_id, parent=name, names=names)
        man.memory, man.team_id = memory, team_id
        await self.snapshot(name, man)
        return info_of_snapshot(man)

    def remove_template(self, name: str) -> None:
        """Out of the catalog at once (renamed to a dot name, then removed), with the
        snapshots of its earlier builds kept for their tags; its own snapshot is the
        caller's to delete."""
        with contextlib.suppress(TemplateMissing):
            for v in self.catalog.get(name).versions:
                with contextlib.suppress(SnapshotNotFound):
                    self.snapshots.delete(v.snapshot_id)
        trash = self.cfg.templates_dir / f".rm-{name}-{secrets.token_hex(3)}"
        os.replace(self.catalog.dir(name), trash)
        remove_tree(trash)

    async def snapshot_build(self, name: str, snapshot_id: str, template: str) -> None:
        """A template build's snapshot of its VM (a step cache entry, or the template): like a
        template's own, it has no parent sandbox, so snapshot listings never show it."""
        m = self._machines[name]
        man = self._manifest_of(m, snapshot_id)
        man.template = template
        await self.snapshot(name, man)

    def has_snapshot(self, snapshot_id: str) -> bool:
        try:
            self.snapshots.get(snapshot_id)
        except (SnapshotNotFound, SnapshotCorrupt):
            return False
        return True

    def snapshot_bytes(self, snapshot_id: str) -> int:
        return tree_usage(self.snapshots.path(snapshot_id)).total

    def snapshot_info(self, snapshot_id: str) -> SnapshotInfo:
        """A sandbox's snapshot (not a template's own, nor a fork's transient one)."""
        try:
            if snapshot_id.startswith(FORK_PREFIX):
                raise SnapshotNotFound(snapshot_id)
            man = self.snapshots.get(snapshot_id)
            if man.parent is None:
                raise SnapshotNotFound(snapshot_id)
        except (SnapshotNotFound, SnapshotCorrupt):
            raise TemplateNotFound(f"snapshot {snapshot_id!r} not found") from None
        return info_of_snapshot(man)

    def list_snapshots(self) -> list[SnapshotInfo]:
        out = []
        for sid in self.snapshots.list():
            with contextlib.suppress(TemplateNotFound):
                out.append(self.snapshot_info(sid))
        return out

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Hide (rename) then remove. VMs restored from it keep their reflinked files; VMs
        primed from it go."""
        try:
            self.snapshots.delete(snapshot_id)
        except SnapshotNotFound:
            raise TemplateNotFound(f"snapshot {snapshot_id!r} not found") from None
        self._primed_snap.forget(snapshot_id)
