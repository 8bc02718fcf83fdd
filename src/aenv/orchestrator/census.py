"""Leak census: every host resource aenv can own, per node instance, and its diff against the
sandbox records.

Everything a node creates is named after its instance (`Config.instance`): slot namespaces
`<i>-s<N>` (holding `tap0`, `veth0` and the `inet aenv` nft table) and host veths `<i>-<N>h`,
jail cgroups `aenv/<i>-<vm>` (v2, or the v1 memory/pids/cpu hierarchies), the jail processes
in them (launcher and QEMU, whose command line names `sandboxes/<i>/<vm>/`), VM directories
`sandboxes/<i>/<vm>` and the database `<i>.db`. Shared by all instances: the snapshot and
template repositories with their staging leftovers (`.tmp-*`, `.del-*`), the image cache's
and build contexts' partial writes, build snapshots no step-cache entry refers to, loop
devices and mounts under the data directory (other than the data filesystem itself).

`diff` says which resources no record explains (leaks) and which records lack what their
state needs (ghosts). An instance whose database a running process holds open is *live*: its
node may hold warm-pool VMs and idle slots that no record names. Zombie processes are not
counted: a reclaimed VMM whose parent died waits for the host's init and holds only a pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sqlite3
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aenv.config import INSTANCE_PATTERN, Config
from aenv.network import netns as ns
from aenv.network.addressing import GUEST_MAC, TAP_MAC
from aenv.network.rules import TABLE, _nft_binary
from aenv.orchestrator.census_volumes import volume_servers
from aenv.orchestrator.states import HAS_VM, SandboxState
from aenv.storage.datafs import image_path
from aenv.vmm import cgroup

S = SandboxState
_INST = INSTANCE_PATTERN
NETNS_RE = re.compile(rf"({_INST})-s(\d+)")
VETH_RE = re.compile(rf"({_INST})-(\d+)h")
JAIL_RE = re.compile(rf"({_INST})-(.+)")
_CGROUP_LINE = re.compile(r"^[^:\n]*:[^:\n]*:/" + cgroup.GROUP + r"/([^/\n]+)", re.M)
# VMs a live node holds without a record: its warm pool (runtime.WarmPool) and template builds.
UNRECORDED_VMS = ("pool-", "build-")
# Records in these states need a running VMM and its directory.
NEEDS_VMM = frozenset({S.RUNNING, S.PAUSING, S.SNAPSHOTTING, S.FORKING})
NEEDS_DIR = NEEDS_VMM | {S.PAUSED, S.RESUMING}
# States whose VMM (if any) a record explains.
MAY_HAVE_VMM = HAS_VM | {S.RESUMING}
STAGING_PREFIXES = (".tmp-", ".del-")
Mine = Callable[[str], bool]  # whether an instance is one the census covers
FORK_PREFIX = "fork-"  # runtime.FORK_PREFIX: a fork's transient snapshot
BUILD_PREFIX = "buildcache-"  # images.stepgc.PREFIX: a build step's snapshot


@dataclass(frozen=True, slots=True)
class Resource:
    """One thing on the host. `kind` is one of KINDS; `owner` the VM or sandbox it belongs
    to (a VM name, slot namespace or sandbox id), when known."""

    kind: str
    name: str
    instance: str | None = None
    owner: str | None = None
    detail: str = ""


KINDS = ("process", "cgroup", "netns", "tap", "nft", "link", "loop", "mount", "vmdir",
         "instdir", "db", "staging", "forksnap", "snapshot", "buildsnap",
         "volsrv")  # fmt: skip


@dataclass
class Census:
    """What was found. `records`: instance -> sandbox id -> state (from `<i>.db`)."""

    data_dir: Path
    home: str  # this host's configured instance: its database and directory may outlive it
    resources: list[Resource] = field(default_factory=list)
    records: dict[str, dict[str, SandboxState]] = field(default_factory=dict)
    live: set[str] = field(default_factory=set)
    instance: str | None = None  # set when the census covers one instance only

    def of(self, kind: str, instance: str | None = None) -> list[Resource]:
        return [r for r in self.resources
                if r.kind == kind and (instance is None or r.instance == instance)]  # fmt: skip

    def instances(self) -> list[str]:
        found = {r.instance for r in self.resources if r.instance} | set(self.records)
        return sorted(found)

    def aliases(self, instance: str) -> dict[str, str]:
        """VM name -> sandbox id for sandboxes restored into pooled VMs (a symlink
        `sandboxes/<i>/<sid>` -> `<pool vm>`)."""
        out = {}
        for r in self.of("vmdir", instance):
            if r.detail.startswith("-> "):
                out[r.detail[3:]] = r.owner or ""
        return out

    def vmm_pids(self, instance: str, sandbox_id: str) -> list[int]:
        """Host pids of the VMM running this sandbox (crash tests kill it)."""
        aliases = self.aliases(instance)
        return [int(r.name) for r in self.of("process", instance)
                if "qemu" in r.detail and aliases.get(r.owner or "", r.owner) == sandbox_id]

    def to_json(self) -> dict[str, object]:
        return {
            "data_dir": str(self.data_dir),
            "instance": self.instance,
            "live": sorted(self.live),
            "records": {i: {s: str(st) for s, st in r.items()} for i, r in self.records.items()},
            "resources": [asdict(r) for r in self.resources],
        }


@dataclass(frozen=True, slots=True)
class Leak:
    resource: Resource
    reason: str


@dataclass(frozen=True, slots=True)
class Ghost:
    instance: str
    sandbox_id: str
    state: str
    missing: str


@dataclass
class Diff:
    leaks: list[Leak] = field(default_factory=list)
    ghosts: list[Ghost] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.leaks and not self.ghosts

    def to_json(self) -> dict[str, object]:
        return {"leaks": [asdict(x) for x in self.leaks],
                "ghosts": [asdict(g) for g in self.ghosts]}

    def split(self, earlier: Mapping[str, Any]) -> tuple[Diff, Diff]:
        """(new, pre-existing): this diff's entries that an earlier diff (its `to_json`, as
        `aenv census --json` prints it) did not have, and those it had. A test run compares
        against a census taken when it started, so that what an interrupted earlier run left
        on the host is reported, not counted as this run's leak."""
        old_leaks = {_leak_key(x["resource"]) for x in earlier.get("leaks", [])}
        old_ghosts = {(g["instance"], g["sandbox_id"]) for g in earlier.get("ghosts", [])}
        new, before = Diff(), Diff()
        for x in self.leaks:
            (before if _leak_key(asdict(x.resource)) in old_leaks else new).leaks.append(x)
        for g in self.ghosts:
            (before if (g.instance, g.sandbox_id) in old_ghosts else new).ghosts.append(g)
        return new, before

    def lines(self) -> list[str]:
        out = [f"leak: {x.resource.kind} {x.resource.name}"
               f"{' [' + x.resource.instance + ']' if x.resource.instance else ''}"
               f"{' (' + x.resource.detail + ')' if x.resource.detail else ''}: {x.reason}"
               for x in self.leaks]  # fmt: skip
        out += [f"ghost: sandbox {g.sandbox_id} [{g.instance}] is {g.state} but {g.missing}"
                for g in self.ghosts]  # fmt: skip
        return out


def _leak_key(resource: Mapping[str, Any]) -> tuple[str, str, str | None, str | None]:
    # Which resource, whatever the reason given for it (that may change between censuses);
    # the owner too, as a process's name is a pid, which the kernel reuses.
    return resource["kind"], resource["name"], resource.get("instance"), resource.get("owner")


# -- the census --------------------------------------------------------------------------


def census(cfg: Config, instance: str | None = None, *, deep: bool = True) -> Census:
    """List every host resource aenv can own (of one instance, or all). `deep` also looks
    inside each slot namespace (its taps and nft tables)."""
    data = cfg.data_dir
    c = Census(data_dir=data, home=cfg.instance, instance=instance)

    def mine(i: str) -> bool:
        return instance is None or i == instance

    vm_root = cfg.sandboxes_dir.parent
    c.resources += _processes(vm_root, mine)
    c.resources += _cgroups(mine)
    c.resources += _netns(mine, deep)
    c.resources += _host_links(mine)
    if instance is None:
        c.resources += _host_taps_and_tables()
    c.resources += _loops_and_mounts(data, vm_root, mine, shared=instance is None)
    c.resources += _vm_dirs(vm_root, mine)
    c.resources += [Resource("volsrv", name, inst, owner, detail)
                    for name, inst, owner, detail in volume_servers(data, mine)]  # fmt: skip
    dbs = [p for p in sorted(data.glob("*.db")) if re.fullmatch(_INST, p.stem) and mine(p.stem)]
    open_dbs = _open_by_others({db: db.stem for db in dbs})
    for db in dbs:
        c.resources.append(Resource("db", str(db), db.stem))
        c.records[db.stem] = read_records(db, in_use=db.stem in open_dbs)
    c.live = open_dbs | {
        r.instance for r in c.of("process") if r.instance and r.detail.endswith("parented")}
    owners = _sandbox_instances(c)
    c.resources += [r for r in _repository(data, owners) if instance is None or r.instance]
    return c


def read_records(db: Path, *, in_use: bool = True) -> dict[str, SandboxState]:
    """sandbox id -> state, read-only. A database nobody has open and with no WAL file is
    read as immutable, so the census leaves no -shm/-wal file beside a stopped node's."""
    wal = db.with_name(db.name + "-wal").exists()
    mode = "ro" if in_use or wal else "ro&immutable=1"
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode={mode}", uri=True,
                                                timeout=5)) as con:  # fmt: skip
            rows = con.execute("SELECT sandbox_id, state FROM sandboxes").fetchall()
    except sqlite3.Error:
        return {}  # no table yet (a node that died while opening it)
    return {sid: SandboxState(state) for sid, state in rows}


def _proc_stat(pid: str) -> tuple[str, int]:
    """(state, parent pid); the command name may hold spaces: count from the last ')'."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0], int(fields[1])


def _processes(vm_root: Path, mine: Mine) -> list[Resource]:
    """Jail processes by cgroup (launcher and VMM), and QEMUs by the VM directory on their
    command line (one that escaped its cgroup)."""
    marker = str(vm_root) + "/"
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            state, ppid = _proc_stat(p.name)
            if state == "Z":
                continue
            m = _CGROUP_LINE.search((p / "cgroup").read_text())
            argv = (p / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, ValueError):
            continue  # gone meanwhile
        exe = os.path.basename(argv[0]) if argv else ""
        where = None
        if m and (j := JAIL_RE.fullmatch(m.group(1))):
            where = (j.group(1), j.group(2), f"cgroup {m.group(1)}")
        elif "qemu-system" in exe:
            for a in argv:
                if marker in a:
                    parts = a.split(marker, 1)[1].split("/")
                    if len(parts) >= 2:
                        where = (parts[0], parts[1], "command line")
                        break
        if where and mine(where[0]):
            # A launcher whose parent is alive (not init) belongs to a running node or
            # runtime: one without a database (a test's runtime) is live too.
            parented = exe == "unshare" and ppid > 1
            out.append(Resource("process", p.name, where[0], where[1],
                                f"{exe}, {where[2]}{', parented' if parented else ''}"))
    return out


def _cgroup_bases() -> list[Path]:
    bases = [cgroup.ROOT / cgroup.GROUP] + [
        cgroup.ROOT / c / cgroup.GROUP for c in ("memory", "pids", "cpu", "unified")]
    seen, out = set(), []
    for b in bases:
        if b.is_dir() and (real := b.resolve()) not in seen:
            seen.add(real)
            out.append(b)
    return out


def _cgroups(mine: Mine) -> list[Resource]:
    out = []
    for base in _cgroup_bases():
        for d in sorted(base.iterdir()):
            if d.is_dir() and (j := JAIL_RE.fullmatch(d.name)) and mine(j.group(1)):
                out.append(Resource("cgroup", str(d), j.group(1), j.group(2)))
    return out


def _inside_slot() -> tuple[list[str], list[str]]:
    """Runs in a slot namespace: its links and nft tables."""
    links = [n for _, n in socket.if_nameindex() if n != "lo"]
    r = subprocess.run([_nft_binary(), "list", "tables"], capture_output=True, text=True,
                       check=False)  # fmt: skip
    return links, [ln.removeprefix("table ").strip() for ln in r.stdout.splitlines() if ln]


def _netns(mine: Mine, deep: bool) -> list[Resource]:
    out = []
    for name in ns.list_netns():
        m = NETNS_RE.fullmatch(name)
        if not m or not mine(m.group(1)):
            continue
        inst = m.group(1)
        path = ns.netns_path(name)
        detail, links, tables = "" if os.path.ismount(path) else "not mounted", [], []
        if deep and not detail:
            try:
                links, tables = ns.run_in_netns(path, _inside_slot)
            except OSError as e:
                detail = f"unreadable: {e}"
        out.append(Resource("netns", name, inst, name, detail))
        out += [Resource("tap", f"{name}/{ln}", inst, name) for ln in links]
        out += [Resource("nft", f"{name}/{t}", inst, name) for t in tables]
    return out


def _host_links(mine: Mine) -> list[Resource]:
    out = []
    for _, name in socket.if_nameindex():
        m = VETH_RE.fullmatch(name)
        if m and mine(m.group(1)):
            out.append(Resource("link", name, m.group(1), f"{m.group(1)}-s{m.group(2)}"))
    return out


def _host_taps_and_tables() -> list[Resource]:
    """What must never be in the host namespace: a link with a guest/tap MAC, an aenv table."""
    out = []
    for d in Path("/sys/class/net").iterdir():
        with contextlib.suppress(OSError):
            if (d / "address").read_text().strip() in (TAP_MAC, GUEST_MAC):
                out.append(Resource("tap", d.name, detail="in the host namespace"))
    with contextlib.suppress(Exception):
        r = subprocess.run([_nft_binary(), "list", "tables"], capture_output=True, text=True,
                           check=False, timeout=10)  # fmt: skip
        for ln in r.stdout.splitlines():
            if ln.split()[-1:] == [TABLE]:
                out.append(Resource("nft", "host/" + ln.removeprefix("table ").strip(),
                                    detail="in the host namespace"))  # fmt: skip
    return out


def _unescape(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def _loops_and_mounts(data: Path, vm_root: Path, mine: Mine, *, shared: bool
                      ) -> list[Resource]:
    """Mounts below the data directory and loop devices backed by files in (or the image
    of) it; the data filesystem itself is not listed."""
    def inst_of(path: str) -> str | None:
        rel = Path(path).relative_to(vm_root).parts if path.startswith(f"{vm_root}/") else ()
        return rel[0] if rel else None

    data_src = None
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mp = _unescape(fields[4])
        src = fields[fields.index("-") + 2]
        if mp == str(data):
            data_src = src
        elif mp.startswith(f"{data}/"):
            i = inst_of(mp)
            if (i and mine(i)) or (not i and shared):
                out.append(Resource("mount", mp, i, detail=src))
    img = str(image_path(data))
    for bf in Path("/sys/block").glob("loop*/loop/backing_file"):
        dev = "/dev/" + bf.parent.parent.name
        with contextlib.suppress(OSError):
            back = bf.read_text().strip().removesuffix(" (deleted)")
            if back == img and dev == data_src:
                continue
            if back == img or back.startswith(f"{data}/"):
                i = inst_of(back)
                if (i and mine(i)) or (not i and shared):
                    out.append(Resource("loop", dev, i, detail=back))
    return out


def _vm_dirs(vm_root: Path, mine: Mine) -> list[Resource]:
    out = []
    if not vm_root.is_dir():
        return out
    for inst_dir in sorted(vm_root.iterdir()):
        inst = inst_dir.name
        if not re.fullmatch(_INST, inst) or not mine(inst):
            continue
        entries = sorted(inst_dir.iterdir()) if inst_dir.is_dir() else []
        out.append(Resource("instdir", str(inst_dir), inst,
                            detail="empty" if not entries else f"{len(entries)} entries"))
        for p in entries:
            if p.is_symlink():
                detail = f"-> {os.readlink(p)}"
            else:
                detail = "paused" if (p / "manifest.json").is_file() else ""
            out.append(Resource("vmdir", str(p), inst, p.name, detail))
    return out


def _sandbox_instances(c: Census) -> dict[str, str]:
    """sandbox id -> instance, from records and VM directories."""
    out = {}
    for inst, recs in c.records.items():
        out.update(dict.fromkeys(recs, inst))
    for r in c.of("vmdir"):
        if r.owner and r.instance:
            out.setdefault(r.owner, r.instance)
    return out


def _manifest_parent(d: Path) -> tuple[bool, str | None]:
    """(readable, parent) of a snapshot directory's manifest."""
    try:
        data = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError):
        return False, None
    parent = data.get("parent") if isinstance(data, dict) else None
    return True, parent if isinstance(parent, str) else None


def _fork_source(name: str) -> str | None:
    # fork-<sandbox id>-<hex>; sandbox ids have no '-'
    parts = name.removeprefix(FORK_PREFIX).split("-")
    return parts[0] if name.startswith(FORK_PREFIX) and len(parts) >= 2 else None


def _repository(data: Path, owners: Mapping[str, str]) -> list[Resource]:
    """Snapshots (sandbox snapshots, transient fork snapshots, staging) and staging in the
    template and artifact trees."""
    out = []
    snaps = data / "snapshots"
    wanted = _wanted_build_snapshots(data)
    for d in sorted(snaps.iterdir()) if snaps.is_dir() else []:
        if d.name.startswith(BUILD_PREFIX) and d.name not in wanted:
            out.append(Resource("buildsnap", str(d), detail="no step-cache entry refers to it"))
        elif d.name.startswith(STAGING_PREFIXES):
            sid = _fork_source(d.name[5:]) or _manifest_parent(d)[1]
            out.append(Resource("staging", str(d), owners.get(sid or ""), sid))
        elif (sid := _fork_source(d.name)) is not None:
            out.append(Resource("forksnap", str(d), owners.get(sid), sid))
        elif d.is_dir():
            ok, parent = _manifest_parent(d)
            if not ok:
                out.append(Resource("snapshot", str(d), detail="no readable manifest"))
            elif parent is not None:
                out.append(Resource("snapshot", str(d), owners.get(parent), parent))
    stray: Iterable[Path] = [
        *(data / "templates").glob(".tmp-*"), *(data / "artifacts").glob("*/tmp-*"),
        *data.glob(".reflink-probe-*"),
        # skopeo's blob being written (renamed to its digest when whole), an upload's file.
        *(data / "images" / "oci").glob("oci-put-blob*"),
        *(data / "images" / "contexts").glob(".tmp-*"),
    ]
    out += [Resource("staging", str(p)) for p in sorted(stray)]
    return out


def _wanted_build_snapshots(data: Path) -> set[str]:
    """Snapshot ids step-cache entries and templates refer to."""
    out = set()
    for f in [*(data / "images" / "step-cache").glob("*.json"),
              *(data / "templates").glob("*/template.json")]:  # fmt: skip
        with contextlib.suppress(OSError, ValueError, AttributeError):
            out.add(str(json.loads(f.read_text()).get("snapshot_id")))
    return out


def _open_by_others(dbs: Mapping[Path, str]) -> set[str]:
    """Instances whose database another process holds open: their node is running."""
    if not dbs:
        return set()
    wanted = {str(p): inst for p, inst in dbs.items()}
    me = str(os.getpid())
    live: set[str] = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or p.name == me:
            continue
        with contextlib.suppress(OSError):
            for fd in os.scandir(p / "fd"):
                with contextlib.suppress(OSError):
                    if (inst := wanted.get(os.readlink(fd.path))) is not None:
                        live.add(inst)
    return live


# -- the diff ----------------------------------------------------------------------------


def diff(
    c: Census,
    records: Mapping[str, Mapping[str, SandboxState | str]] | None = None,
    *,
    live: Iterable[str] | None = None,
    strict: bool = False,
) -> Diff:
    """Resources no record explains (leaks) and records whose resources are missing
    (ghosts). `records`/`live` default to what the census read; a caller that runs VMs
    without a database (the integration runtime) passes its own. `strict`: sandbox
    snapshots count as leaks too (a test run must delete what it snapshots)."""
    recs = {i: {s: SandboxState(st) for s, st in r.items()}
            for i, r in (c.records if records is None else records).items()}  # fmt: skip
    alive = set(c.live if live is None else live)
    out = Diff()
    for r in c.resources:
        reason = _unexplained(c, r, recs, alive, strict)
        if reason:
            out.leaks.append(Leak(r, reason))
    for inst, rs in sorted(recs.items()):
        if c.instance is not None and inst != c.instance:
            continue
        out.ghosts += _ghosts(c, inst, rs, alive)
    return out


def _vm_explained(c: Census, r: Resource, recs: Mapping[str, Mapping[str, SandboxState]],
                  alive: set[str]) -> bool:  # fmt: skip
    inst = r.instance or ""
    owner = r.owner or ""
    sid = c.aliases(inst).get(owner, owner)
    st = recs.get(inst, {}).get(sid)
    if st in MAY_HAVE_VMM:
        return True
    # A running node keeps hot-paused sandboxes' stopped VMMs (machines/hot.py); a dead
    # node's are leaks (the next node start reclaims them).
    return inst in alive and (st is S.PAUSED or owner.startswith(UNRECORDED_VMS))


def _slot_changing(link: Resource) -> bool:
    """Whether a host link the census saw without its slot namespace belongs to a slot
    made between its two reads: namespaces are read first, links after, and a slot is made
    namespace first, link after (taken down link first), so that slot's namespace is
    there when looked at again."""
    return ns.netns_path(link.owner).exists()


def _unexplained(c: Census, r: Resource, recs: Mapping[str, Mapping[str, SandboxState]],
                 alive: set[str], strict: bool) -> str | None:  # fmt: skip
    """Why r is a leak, or None."""
    inst = r.instance or ""
    mine = recs.get(inst, {})
    live = inst in alive
    kind = r.kind
    if live and inst not in recs:
        return None  # a running runtime without a database (a test's): nothing to go by
    if kind in ("process", "cgroup"):
        return None if _vm_explained(c, r, recs, alive) else "no record with a VM owns it"
    if kind in ("netns", "tap", "nft", "volsrv") and r.instance:
        return None if live else "its node is not running"
    if kind == "link":
        has_ns = any(x.name == r.owner for x in c.of("netns", inst))
        if live and not has_ns and _slot_changing(r):
            return None
        return None if live and has_ns else "no slot namespace of a running node"
    if kind in ("tap", "nft", "loop", "mount"):
        return "aenv never leaves this behind"
    if kind == "vmdir":
        sid = c.aliases(inst).get(r.owner or "", r.owner or "")
        if sid in mine or (live and (r.owner or "").startswith(UNRECORDED_VMS)):
            return None
        return "no record names it"
    if kind in ("instdir", "db"):
        return None if live or mine or inst == c.home else "an instance with no node and no records"
    if kind == "forksnap":
        src = mine.get(r.owner or "")
        return None if live and src is S.FORKING else "a fork's snapshot outlived the fork"
    if kind == "staging":
        if r.instance:
            return None if live else "an interrupted write or delete"
        return None if alive else "an interrupted write or delete"
    if kind == "buildsnap":  # a live node's build may be between snapshot and entry
        return None if alive else "a build snapshot no step-cache entry refers to"
    if kind == "snapshot":
        if r.detail:
            return r.detail
        return "left by a test (strict)" if strict else None
    return None


def _ghosts(c: Census, inst: str, recs: Mapping[str, SandboxState],
            alive: set[str]) -> list[Ghost]:
    aliases = c.aliases(inst)
    procs = {aliases.get(r.owner or "", r.owner) for r in c.of("process", inst)
             if "qemu" in r.detail}  # fmt: skip
    dirs = {r.owner: r for r in c.of("vmdir", inst)}
    out = []
    for sid, st in sorted(recs.items()):
        missing = None
        if st in NEEDS_DIR and sid not in dirs:
            missing = "its VM directory is missing"
        elif st in NEEDS_VMM and sid not in procs:
            missing = "no VMM process runs it"
        elif st is S.PAUSED and not Path(dirs[sid].name, "manifest.json").is_file():
            missing = "its paused state (manifest.json) is missing"
        elif st is S.PAUSED and sid in procs and inst not in alive:
            missing = "a VMM still runs it, and its node is not running"
        if missing:
            out.append(Ghost(inst, sid, str(st), missing))
    return out
