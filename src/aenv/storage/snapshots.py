"""Snapshot repository: device state + RAM file + disk file + a JSON manifest, stored by
reflink under the snapshot id. Templates are named snapshots. A filesystem-only snapshot
(`Manifest.memory` false) holds the disk alone: a VM made from it cold-boots that disk.

A snapshot directory becomes visible only by an atomic rename of a complete, fsynced
staging directory, so a crash never leaves a half-written snapshot listed.

Integrity (docs/runtime.md, "Checksums"): `put` hashes the small `state` file into the
manifest, and every restore checks it (`check_restorable`). The chunk checksums of all
files (`checksums.json`) are computed later by a background worker (`compute_checksums`),
re-checked by the scrubber and on demand (`verify`); a mismatch writes a `corrupt` marker
and restores refuse the snapshot from then on.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from aenv.config import MachineShape
from aenv.faults import fault
from aenv.storage import checksums as checksums_mod
from aenv.storage.files import clone, fsync_path, write_json_atomic
from aenv.teams.model import DEFAULT_TEAM

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
FILES = ("state", "memory", "disk")
DISK_ONLY = ("disk",)  # a filesystem-only snapshot's files
CHECKSUMS_FILE = "checksums.json"
CORRUPT_FILE = "corrupt"  # {"reason", "at"}: the snapshot must not be restored
# A temporary file of an interrupted atomic write older than this is garbage (a live
# writer holds its temporary file for milliseconds).
STALE_TMP_S = 3600


class SnapshotNotFound(Exception):
    pass


class SnapshotCorrupt(Exception):
    pass


class SnapshotUnusable(SnapshotCorrupt):
    """The snapshot exists but must not be restored: marked corrupt, or its device state is
    not the one saved."""


@dataclass
class Manifest:
    snapshot_id: str
    shape: MachineShape
    kernel: str  # path of the kernel the guest runs (its memory holds that kernel)
    tools: str  # path of the tools drive the guest has mounted
    cmdline: str
    template: str
    parent: str | None = None
    names: list[str] = field(default_factory=list)
    env_vars: dict[str, str] = field(default_factory=dict)
    created_at: str = ""
    format_version: int = FORMAT_VERSION
    # sha256 of `state`, taken when it was written: every restore checks it (~100 KB).
    state_sha256: str | None = None
    # The chunk-checksum record beside the files, computed in the background; None where
    # nothing is checked (a fork's transient snapshot, a paused sandbox's own files).
    checksums: str | None = None
    # False: filesystem-only, the disk alone (no RAM, no device state); a VM made from it
    # cold-boots the disk with this kernel, tools drive and command line.
    memory: bool = True
    # Set on a copy this node fetched from a peer or the snapshot store (store/): where
    # from and when, and what creates from it take from its template (Published.origin).
    fetched: dict[str, object] | None = None
    # The team of the sandbox it was taken from (teams/): only that team sees it, on any node.
    team_id: str = DEFAULT_TEAM

    @property
    def files(self) -> tuple[str, ...]:
        return FILES if self.memory else DISK_ONLY

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["shape"] = self.shape.model_dump()
        return d

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Manifest:
        if d.get("format_version") != FORMAT_VERSION:
            raise SnapshotCorrupt(f"unsupported snapshot format {d.get('format_version')!r}")
        d = dict(d)
        d["shape"] = MachineShape.model_validate(d["shape"])
        # Written before checksums existed: the background worker computes its record.
        d.setdefault("checksums", CHECKSUMS_FILE)
        d.setdefault("memory", True)  # written before filesystem-only snapshots existed
        if not isinstance(d["memory"], bool):
            raise SnapshotCorrupt(f"unexpected memory flag {d['memory']!r}")
        if d["checksums"] not in (None, CHECKSUMS_FILE):
            raise SnapshotCorrupt(f"unexpected checksum record name {d['checksums']!r}")
        return cls(**d)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Verification:
    """Outcome of re-hashing one snapshot: `ok`, `corrupt` (marked; `detail` says why) or
    `unverified` (no checksum record yet, or none wanted)."""

    snapshot_id: str
    status: Literal["ok", "corrupt", "unverified"]
    detail: str = ""


def corrupt_reason(directory: Path) -> str | None:
    """Why the snapshot in `directory` is marked unusable; None if it is not."""
    try:
        data = json.loads((directory / CORRUPT_FILE).read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        return "marked corrupt (unreadable marker)"
    return str(data.get("reason", "marked corrupt")) if isinstance(data, dict) else "corrupt"


def check_restorable(directory: Path, man: Manifest) -> None:
    """Raise SnapshotUnusable if the snapshot in `directory` (a stored snapshot, or a paused
    sandbox's own directory) is marked corrupt or its device state is not the one saved.
    Cheap enough for every restore: one stat and one hash of ~100 KB."""
    reason = corrupt_reason(directory)
    if reason is not None:
        raise SnapshotUnusable(f"{man.snapshot_id} is marked corrupt: {reason}")
    if man.state_sha256 is not None:
        try:
            got = checksums_mod.sha256_file(directory / "state")
        except FileNotFoundError:
            raise SnapshotUnusable(f"{man.snapshot_id}: device state file missing") from None
        if got != man.state_sha256:
            raise SnapshotUnusable(
                f"{man.snapshot_id}: device state sha256 {got[:16]}... is not the saved "
                f"{man.state_sha256[:16]}...")


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _same_fs(a: Path, b: Path) -> bool:
    return a.stat().st_dev == b.stat().st_dev


class SnapshotStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        # Snapshots put by this process whose checksum record is still to be computed
        # (thread-safe appends/pops: put runs in worker threads).
        self.pending: collections.deque[str] = collections.deque()

    def path(self, snapshot_id: str) -> Path:
        if not snapshot_id or "/" in snapshot_id or snapshot_id.startswith("."):
            raise SnapshotNotFound(snapshot_id)
        return self.root / snapshot_id

    def new_id(self) -> str:
        return "snap-" + uuid.uuid4().hex[:16]

    @contextlib.contextmanager
    def _staged(self, snapshot_id: str) -> Iterator[Path]:
        """A staging directory that becomes the snapshot `snapshot_id` when the block ends
        (an atomic rename), or goes if it raises."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.path(snapshot_id)
        stage = self.root / f".tmp-{snapshot_id}"
        stage.mkdir(mode=0o755)
        # Held until the rename: tells gc_staging (of any node sharing the store) that this
        # staging directory has a live writer. The kernel drops it if this process dies.
        lock = os.open(stage, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield stage
            fault("snapshot.before_rename")
            os.replace(stage, final)
            fsync_path(self.root)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        finally:
            os.close(lock)

    def put(self, manifest: Manifest, sources: dict[str, Path], *, checksums: bool = True
            ) -> Path:
        """Clone `sources` (`manifest.files`: state, memory, disk; or the disk alone) into a
        new snapshot; return its dir. The state file is hashed here (cheap); with
        `checksums`, the snapshot is queued for its chunk checksums, computed later off this
        path."""
        with self._staged(manifest.snapshot_id) as stage:
            for name in manifest.files:
                dst = stage / name
                if name == "memory" and _same_fs(sources[name], stage):
                    # A RAM file is never changed once written (vmm/ram.py): the snapshot
                    # shares its inode, so VMs restored from it share the page cache of
                    # the VM it was taken from.
                    os.link(sources[name], dst)
                else:
                    clone(sources[name], dst)
                    fsync_path(dst)
                dst.chmod(0o444)  # shared artifacts: root-owned, read-only for jails
                if os.geteuid() == 0 and dst.stat().st_uid != 0:
                    os.chown(dst, 0, 0)  # a linked RAM file a jail's VMM created
            manifest.state_sha256 = (checksums_mod.sha256_file(stage / "state")
                                     if manifest.memory else None)  # fmt: skip
            manifest.checksums = CHECKSUMS_FILE if checksums else None
            manifest.created_at = manifest.created_at or now_rfc3339()
            write_json_atomic(stage / "manifest.json", manifest.to_json())
        if checksums:
            self.pending.append(manifest.snapshot_id)
        return self.path(manifest.snapshot_id)

    def adopt(self, snapshot_id: str, fill: Callable[[Path], Manifest],
              record: checksums_mod.ChecksumRecord) -> Path:
        """A snapshot whose files `fill` writes into a staging directory (a fetch from
        another node or the snapshot store), returning its manifest; `record` is the
        checksum record its files were checked against as they came."""
        with self._staged(snapshot_id) as stage:
            manifest = fill(stage)
            for name in manifest.files:
                (stage / name).chmod(0o444)
            checksums_mod.write_record(stage / CHECKSUMS_FILE, record)
            manifest.checksums = CHECKSUMS_FILE
            write_json_atomic(stage / "manifest.json", manifest.to_json())
        return self.path(snapshot_id)

    def get(self, snapshot_id: str) -> Manifest:
        p = self.path(snapshot_id) / "manifest.json"
        try:
            data = json.loads(p.read_text())
            m = Manifest.from_json(data)
        except FileNotFoundError:
            raise SnapshotNotFound(snapshot_id) from None
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise SnapshotCorrupt(f"{snapshot_id}: bad manifest: {e}") from e
        for name in m.files:
            if not (self.path(snapshot_id) / name).is_file():
                raise SnapshotCorrupt(f"{snapshot_id}: missing {name}")
        return m

    def file(self, snapshot_id: str, name: str) -> Path:
        return self.path(snapshot_id) / name

    def list(self) -> list[str]:
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir()
                      if p.is_dir() and not p.name.startswith("."))

    def delete(self, snapshot_id: str) -> None:
        p = self.path(snapshot_id)
        if not p.exists():
            raise SnapshotNotFound(snapshot_id)
        trash = self.root / f".del-{snapshot_id}-{uuid.uuid4().hex[:6]}"
        os.replace(p, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def gc_staging(self) -> None:
        """Remove staging/deleted leftovers of an interrupted put or delete, and temporary
        files of interrupted record writes. Nodes of other instances may share this store
        and be in the middle of a put: a staging directory goes only when no process holds
        its lock (its writer died). A `.del-` directory is already unlisted: always safe."""
        if self.root.exists():
            for p in self.root.iterdir():
                if p.name.startswith(".del-") or (p.name.startswith(".tmp-") and _abandoned(p)):
                    shutil.rmtree(p, ignore_errors=True)
                elif p.is_dir():
                    for tmp in p.glob(".*.tmp"):
                        if _stale(tmp):
                            tmp.unlink(missing_ok=True)

    # -- integrity -------------------------------------------------------------------------
    def corrupt_reason(self, snapshot_id: str) -> str | None:
        return corrupt_reason(self.path(snapshot_id))

    def mark_corrupt(self, snapshot_id: str, reason: str) -> None:
        """Make the snapshot unusable (restores refuse it); atomic, so a crash leaves it
        either marked or not."""
        try:
            write_json_atomic(self.path(snapshot_id) / CORRUPT_FILE,
                              {"reason": reason, "at": now_rfc3339()})
        except FileNotFoundError:
            raise SnapshotNotFound(snapshot_id) from None
        log.error("snapshot %s marked corrupt: %s", snapshot_id, reason)

    def queue_missing(self) -> list[str]:
        """Queue every snapshot that wants a checksum record and has none (built before
        checksums existed, or the node stopped while hashing it)."""
        queued = []
        for sid in self.list():
            with contextlib.suppress(SnapshotNotFound, SnapshotCorrupt):
                if self._wants_checksums(sid, self.get(sid)):
                    self.pending.append(sid)
                    queued.append(sid)
        return queued

    def next_pending(self) -> str | None:
        try:
            return self.pending.popleft()
        except IndexError:
            return None

    def compute_checksums(self, snapshot_id: str,
                          pacer: checksums_mod.Pacer | None = None) -> bool:
        """Hash every file of the snapshot into its checksum record. False if it wants
        none or already has one. SnapshotNotFound if it was deleted meanwhile. A manifest
        stored before state hashes existed gets its `state_sha256` now, so restores check
        it from then on."""
        man = self.get(snapshot_id)
        d = self.path(snapshot_id)
        if not self._wants_checksums(snapshot_id, man):
            return False
        assert man.checksums is not None
        try:
            backfill = man.memory and man.state_sha256 is None
            if backfill:
                man.state_sha256 = checksums_mod.sha256_file(d / "state")
            if not (d / man.checksums).exists():
                files = {name: checksums_mod.file_sums(d / name, pacer=pacer)
                         for name in man.files}
                checksums_mod.write_record(d / man.checksums, checksums_mod.ChecksumRecord(
                    snapshot_id=snapshot_id, created_at=now_rfc3339(), files=files))
            if backfill:
                write_json_atomic(d / "manifest.json", man.to_json())
        except FileNotFoundError:
            raise SnapshotNotFound(snapshot_id) from None
        return True

    def _wants_checksums(self, snapshot_id: str, man: Manifest) -> bool:
        """A checked snapshot lacking its record or (stored before them) its state hash."""
        return man.checksums is not None and (
            (man.memory and man.state_sha256 is None)
            or not (self.path(snapshot_id) / man.checksums).exists())

    def verify(self, snapshot_id: str,
               pacer: checksums_mod.Pacer | None = None) -> Verification:
        """Re-hash every chunk of the snapshot against its record (the scrubber, and the
        on-demand check an import or fetch makes). A mismatch, or a record that cannot be
        read, marks the snapshot corrupt."""
        man = self.get(snapshot_id)
        d = self.path(snapshot_id)
        reason = corrupt_reason(d)
        if reason is not None:
            return Verification(snapshot_id, "corrupt", reason)
        if man.checksums is None:
            return Verification(snapshot_id, "unverified", "no checksums kept for it")
        problems: list[str] = []
        try:
            if man.state_sha256 is not None and (
                    man.state_sha256 != checksums_mod.sha256_file(d / "state")):
                problems.append("state: sha256 is not the manifest's")
            try:
                rec = checksums_mod.read_record(d / man.checksums)
            except checksums_mod.ChecksumRecordError as e:
                problems.append(f"checksum record unreadable: {e}")
            else:
                if rec is not None:
                    problems += _chunk_problems(d, man.files, rec, pacer)
                elif not problems:
                    return Verification(snapshot_id, "unverified", "no checksum record yet")
        except FileNotFoundError:
            raise SnapshotNotFound(snapshot_id) from None
        if not problems:
            return Verification(snapshot_id, "ok")
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        reason = "; ".join(problems[:3]) + more
        self.mark_corrupt(snapshot_id, reason)
        return Verification(snapshot_id, "corrupt", reason)


def _chunk_problems(directory: Path, files: tuple[str, ...],
                    rec: checksums_mod.ChecksumRecord,
                    pacer: checksums_mod.Pacer | None) -> list[str]:
    out = []
    for name in files:
        sums = rec.files.get(name)
        if sums is None:
            out.append(f"{name}: not in the checksum record")
            continue
        out += [f"{name}: {p}" for p in checksums_mod.verify_file(
            directory / name, sums, rec.chunk_size, pacer)]
    return out


def _stale(p: Path) -> bool:
    try:
        return time.time() - p.lstat().st_mtime > STALE_TMP_S
    except FileNotFoundError:
        return False


def _abandoned(stage: Path) -> bool:
    """No live put holds the staging directory's lock. (A put locks right after its mkdir;
    the age check covers that instant.)"""
    try:
        if time.time() - stage.lstat().st_mtime < 1:
            return False
        fd = os.open(stage, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # the rmtree that follows needs no lock: nobody can take this name again
    return True
