"""Pause and resume: the paused state on disk, the hot tier's kept VMMs (`hot.py`),
resume by continue, restore or reboot."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path

from aenv.faults import fault
from aenv.machines import adoption, agent_replies, durability, guest_flush, hot
from aenv.machines.agent_replies import GuestReplyError
from aenv.machines.api import (
    AGENT_PORT,
    AgentInit,
    GuestUnresponsive,
    SandboxHandle,
)
from aenv.machines.machine import (
    AGENT_INIT_TIMEOUT,
    CLOCK_RESYNC_S,
    GUEST_CHECK_TIMEOUT,
    GUEST_FLUSH_TIMEOUT,
    PAUSE_MARKER,
    BootError,
    Machine,
    PausedStateMissing,
)
from aenv.obs import RESUMES
from aenv.storage.checksums import sha256_file
from aenv.storage.files import fsync_path, write_json_atomic
from aenv.storage.snapshots import (
    Manifest,
    SnapshotCorrupt,
    now_rfc3339,
)
from aenv.vmm import ram

log = logging.getLogger(__name__)

class Pausing:
    """Part of `Runtime` (machines/runtime.py), whose state it uses."""

    async def _save(self, m: Machine, state: Path, *, remap: bool = True, durable: bool = True
                    ) -> tuple[ram.Saved, tuple[float, float, float]]:
        """Stop vCPUs and make device state, RAM and disk durable in the VM's files: the
        pages the guest wrote go into its RAM file (`vmm/ram.py`), which the VMM then maps
        in their place unless `remap` is false (a VMM that ends, or a hot one: its tier
        rebases it before handing its RAM back). Not `durable`: the files are left in the
        page cache, for `durability` to fsync. Returns what was saved and how long
        stopping, saving and writing took (s): bench/fast.py's limit for a pause."""
        t0 = time.perf_counter()
        await m.vm.pause()
        fault("save.after_stop")
        t1 = time.perf_counter()
        await m.vm.save(state)
        t2 = time.perf_counter()
        saved, *_ = await asyncio.gather(
            asyncio.to_thread(self.pager.write, m, remap=remap, durable=durable),
            *(asyncio.to_thread(fsync_path, m.workdir / f) for f in ("disk", state.name)
              if durable))
        return saved, (t1 - t0, t2 - t1, time.perf_counter() - t2)

    # -- pause / resume / fork ---------------------------------------------------------
    async def pause(self, name: str, *, memory: bool = True,
                    require_healthy_guest: bool = False) -> None:
        """Save the VM into its own directory and end the VMM: a paused sandbox holds no
        CPU, no RAM (its files' pages become clean cache) and no slot. Filesystem-only
        (`memory=False`): the guest flushes its filesystems first and only the disk is kept
        (no RAM file, no device state); resuming it is a reboot."""
        m = self._machines[name]
        await self._settled(m)
        if require_healthy_guest:
            # Fail fast on a wedged agent (the SDK retries a 503), before a long flush wait.
            await guest_flush.check_agent(m.http, m.slot.url(AGENT_PORT), GUEST_CHECK_TIMEOUT)
        if not memory:
            await self._flush_guest(m, strict=require_healthy_guest)
        took = (0.0, 0.0, 0.0)
        saved = None
        hot = memory and self.hot.enabled  # durable after the answer (durability.py)
        try:
            if memory:
                saved, took = await self._save(m, m.workdir / "state", remap=False,
                                               durable=not hot)
            else:
                await m.vm.pause()  # stop vCPUs: nothing more reaches the disk
            fault("pause.after_save")
            t0 = time.perf_counter()
            man = self._manifest_of(m, name)
            man.created_at = now_rfc3339()
            await asyncio.to_thread(self._mark_paused, m.workdir, man, memory, not hot)
            fault("pause.after_manifest")
            log.debug("pause %s: stop=%.1fms save=%.1fms fsync=%.1fms mark=%.1fms", name,
                      *(x * 1e3 for x in took), (time.perf_counter() - t0) * 1e3)
        except BaseException:
            # Keep it running if it can; no paused state may stay behind a running guest.
            try:
                await asyncio.to_thread(self._forget_paused, m.workdir)
                await m.vm.resume()
            except BaseException:
                log.exception("pause of %s failed and its VM cannot continue", name)
                await self.destroy(name)
            raise
        if saved is not None and hot:
            self.fsyncs.start(name, m.workdir)
            await self._keep_hot(m, saved)
            return
        await self._stop(m)
        if not memory:
            await asyncio.to_thread(self._keep_disk_only, m.workdir)

    async def _keep_hot(self, m: Machine, saved: ram.Saved) -> None:
        """The paused state is durable: keep the stopped VMM and its slot (hot tier). It is
        no longer the sandbox's running VM, so its adoption record goes: a node restart
        reclaims it and the sandbox resumes cold."""
        self._machines.pop(m.name, None)
        with contextlib.suppress(OSError):
            await asyncio.to_thread(adoption.remove, m.workdir)
        await self.hot.keep(m, saved)

    def tier(self, name: str) -> str | None:
        """A paused sandbox's tier, "hot" or "cold"; None when it is not paused."""
        if name in self.hot:
            return "hot"
        return "cold" if self.is_paused(name) else None

    async def _flush_guest(self, m: Machine, *, strict: bool) -> None:
        """`sync` in the guest before a filesystem-only pause. A guest that does not answer
        fails a strict pause (nothing changed); otherwise its disk is kept as it is, like
        after a power cut (ext4's journal keeps it mountable; unflushed writes are lost)."""
        try:
            await guest_flush.sync_filesystems(m.http, m.slot.url(AGENT_PORT), m.access_token,
                                               GUEST_FLUSH_TIMEOUT)  # fmt: skip
        except GuestUnresponsive as e:
            if strict:
                raise
            log.warning("filesystem-only pause of %s: the guest did not flush its "
                        "filesystems (%s); its disk is kept as it is", m.name, e)  # fmt: skip

    @staticmethod
    def _mark_paused(workdir: Path, man: Manifest, memory: bool, durable: bool = True) -> None:
        if memory:  # a resume checks it (check_restorable): ~100 KB, well under 1 ms
            man.state_sha256 = sha256_file(workdir / "state")
        write_json_atomic(workdir / PAUSE_MARKER, durability.marker(memory, durable))
        # The manifest last: its presence is what makes the directory a paused sandbox.
        write_json_atomic(workdir / "manifest.json", man.to_json())

    @staticmethod
    def _keep_disk_only(workdir: Path) -> None:
        """Make a paused VM directory filesystem-only: the disk durable, the RAM file and
        device state gone. The marker goes first: once a reboot has changed the disk, its
        old memory state must never be restored over it."""
        fsync_path(workdir / "disk")
        write_json_atomic(workdir / PAUSE_MARKER, {"memory": False})
        for f in ("memory", "state", ram.BASE_NAME, ram.RUNS_NAME):
            (workdir / f).unlink(missing_ok=True)
        fsync_path(workdir)

    @staticmethod
    def _forget_paused(workdir: Path) -> None:
        (workdir / "manifest.json").unlink(missing_ok=True)
        (workdir / PAUSE_MARKER).unlink(missing_ok=True)
        fsync_path(workdir)

    def paused_with_memory(self, name: str) -> bool:
        """The paused state in the VM's directory holds RAM and device state (a full pause);
        False after a filesystem-only pause (resume reboots)."""
        try:
            data = json.loads((self.cfg.sandboxes_dir / name / PAUSE_MARKER).read_text())
        except FileNotFoundError:
            return True  # paused before the marker existed: always a full pause
        except ValueError:
            return False  # unreadable: the disk alone is always resumable
        return isinstance(data, dict) and data.get("memory") is not False

    def paused_manifest(self, name: str) -> Manifest:
        with contextlib.suppress(OSError, ValueError):
            marker = json.loads((self.cfg.sandboxes_dir / name / PAUSE_MARKER).read_text())
            if durability.lost(marker):
                raise PausedStateMissing(f"sandbox {name}'s paused state was not yet on disk "
                                         "when the host went down")  # fmt: skip
        try:
            data = json.loads((self.cfg.sandboxes_dir / name / "manifest.json").read_text())
            return Manifest.from_json(data)
        except (FileNotFoundError, ValueError, TypeError, KeyError, SnapshotCorrupt) as e:
            raise PausedStateMissing(f"sandbox {name} has no usable paused state: {e}") from e

    def is_paused(self, name: str) -> bool:
        return name not in self._machines and (
            self.cfg.sandboxes_dir / name / "manifest.json").is_file()

    def is_running(self, name: str) -> bool:
        """A VMM runs the sandbox (one that exited on its own is not running any more)."""
        m = self._machines.get(name)
        return m is not None and m.exited is None

    async def resume(self, name: str, init: AgentInit, *, memory: bool = True
                     ) -> SandboxHandle:
        self.fsyncs.taken(name)  # its marker is not written again once it is gone
        if memory and name in self.hot:
            try:
                return await self._resume_hot(name, init)
            except ram.RamError as e:  # its VMM is ended; its paused files are whole
                log.warning("hot resume of %s failed, resuming cold: %s", name, e)
        await self.hot.demote(name, "reboot")  # a reboot needs its files, not its VMM
        if not memory or not self.paused_with_memory(name):
            return await self._reboot(name, init)
        await self.pager.make_room(self.paused_manifest(name).shape.memory_mib)
        m = await self.restore(name, None)
        RESUMES.labels("cold").inc()
        fault("resume.before_init")
        try:
            await self.push_init(m, init)
        except BaseException:
            # The guest has run since the restore: save it again so it stays resumable.
            try:
                await self.pause(name)
            except BaseException:
                log.exception("re-pause of %s after a failed resume failed", name)
                if name in self._machines:
                    await self.destroy(name)
            raise
        return self.handle(name, m.template_id)

    async def _resume_hot(self, name: str, init: AgentInit) -> SandboxHandle:
        """Continue the kept VMM. The paused state goes before the guest runs (as a restore
        does); the clock push and the adoption record follow in the background, and the
        data plane holds the sandbox's requests until they are done (`handle.ready`)."""
        h = self.hot.take(name)
        assert h is not None
        m = h.machine
        t0 = time.perf_counter()
        try:
            await hot.released(h)  # a rebase must not run beside the guest
        except ram.RamError:
            await self._stop(m)
            raise
        try:
            fault("resume.before_restore")
            await asyncio.to_thread(self._forget_paused, m.workdir)
            # The released RAM is read back beside the continue: the guest's first touches
            # wait only for pages still in flight.
            self._background(asyncio.to_thread(self._page_in, h))
            await m.vm.resume()
            fault("resume.before_init")
        except BaseException:
            await self._stop(m)
            raise
        self._machines[name] = m  # its watcher reports to _sandbox_vmm_exited already
        RESUMES.labels("hot").inc()
        handle = self.handle(name, m.template_id)
        m.ready = handle.ready = asyncio.get_running_loop().create_task(
            self._after_hot_resume(m, init))
        log.debug("resume %s (hot, released=%s): %.1fms", name, h.released,
                  (time.perf_counter() - t0) * 1e3)
        return handle

    @staticmethod
    def _page_in(h: hot.HotVm) -> None:
        try:
            hot.page_in(h)
        except OSError as e:  # only a prefetch: the guest faults its pages in anyway
            log.info("prefetch for %s failed: %s", h.machine.name, e)

    async def _after_hot_resume(self, m: Machine, init: AgentInit) -> None:
        """The guest's clock is behind by the pause: set it (the agent's /init with only a
        timestamp keeps identity and token), then record the VM for adoption. A resume that
        brings another token (not the orchestrator's: it keeps the sandbox's) gets the
        whole /init."""
        t0 = time.perf_counter()
        try:
            if init.access_token != m.access_token:
                await self.push_init(m, init)
                return
            await self._push_clock(m)
            if time.perf_counter() - t0 > CLOCK_RESYNC_S:
                await self._push_clock(m)
            t1 = time.perf_counter()
            await asyncio.to_thread(adoption.write, m.workdir, self._adoption_record(m))
            log.debug("after hot resume %s: clock=%.1fms record=%.1fms", m.name,
                      (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3)
        except (GuestReplyError, OSError, ProcessLookupError, BootError) as e:
            log.warning("after the hot resume of %s: %s", m.name, e)

    @staticmethod
    async def _push_clock(m: Machine) -> None:
        """Set the guest's clock (the agent's /init with only a timestamp keeps identity and
        token). The guest sets the time it is sent, so the answer's delay is its error."""
        try:
            r = await agent_replies.request(
                m.http, "POST", m.slot.url(AGENT_PORT) + "/init",
                json={"timestamp": now_rfc3339()}, deadline_s=AGENT_INIT_TIMEOUT)
        except GuestReplyError as e:
            log.warning("clock push to %s failed: %s", m.name, e)
            return
        if r.status >= 300:
            log.warning("clock push to %s answered %s", m.name, r.status)

    async def _reboot(self, name: str, init: AgentInit) -> SandboxHandle:
        """Resume by reboot: cold-boot the paused sandbox's own disk with the kernel, tools
        drive, command line and shape it ran with, then push init (same id, token, env).
        Processes are gone, files are kept; a memory state, if any, is discarded first. On
        failure the sandbox stays paused, filesystem-only: a disk is always rebootable."""
        man = self.paused_manifest(name)
        await asyncio.to_thread(self._keep_disk_only, self.cfg.sandboxes_dir / name)
        slot, workdir = await self._prepare(name, fresh=False)
        t0 = time.perf_counter()
        try:
            m = await self._boot_disk(name, man.template, slot, workdir, man.shape,
                                      Path(man.kernel), Path(man.tools), man.cmdline,
                                      keep_dir=True)  # fmt: skip
            try:
                await self.push_init(m, init)
            except BaseException:
                await self._stop(m)
                raise
        except BaseException:
            # Paused as before: the disk alone (the boot's RAM file goes).
            await asyncio.to_thread(self._keep_disk_only, workdir)
            raise
        await asyncio.to_thread(self._forget_paused, workdir)
        log.debug("reboot %s: boot+init=%.1fms", name, (time.perf_counter() - t0) * 1e3)
        return self.handle(name, m.template_id)
