"""The jail's filesystem: a minimal read-only root holding only what the VMM needs.

Seen from inside by a probe program started through the very launcher QEMU uses
(`jail.spawn`, the probe instead of QEMU), and from outside on real QEMU processes through
/proc/<pid>/root.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import secrets
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aenv.machines.api import AgentInit
from aenv.storage.files import remove_tree
from aenv.vmm import jail
from aenv.vmm.cgroup import Cgroup, Limits
from aenv.vmm.jailroot import RootSpec

pytestmark = pytest.mark.vm

# Looks around from inside the jail; prints one JSON object.
PROBE = textwrap.dedent("""
    import json, os, sys
    exists, writes, own = json.loads(sys.argv[1])
    out = {"uid": os.getuid(), "env": dict(os.environ), "root": sorted(os.listdir("/")),
           "etc": sorted(os.listdir("/etc")), "dev": sorted(os.listdir("/dev")),
           "pids": sorted(p for p in os.listdir("/proc") if p.isdigit()),
           "mounts": open("/proc/self/mountinfo").read().splitlines(),
           "exists": {p: os.path.lexists(p) for p in exists}, "writes": {}}
    for p in writes:
        try:
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o600))
            out["writes"][p] = "ok"
        except OSError as e:
            out["writes"][p] = e.errno
    out["own"] = sorted(os.listdir(own))
    print(json.dumps(out))
""")


@dataclass
class Layout:
    data_dir: Path
    own: Path  # the probe's "VM directory"
    other: Path  # another VM's directory
    owned_ro: Path  # a read-only path the jail uid owns: only the mount keeps it from writing
    artifacts: tuple[Path, ...]  # the real kernel and tools drive
    uid: int


def _template_artifacts(runtime) -> tuple[Path, ...]:
    tpl = runtime.catalog.get(runtime.cfg.default_template)
    man = runtime.snapshots.get(tpl.snapshot_id)
    return Path(man.kernel), Path(man.tools)


@pytest.fixture
def layout(runtime) -> Iterator[Layout]:
    cfg = runtime.cfg
    # The top of the uid range: no slot of a node with an ordinary pool size uses it.
    uid = cfg.jail_uid_base + cfg.jail_uid_count - 2
    base = cfg.sandboxes_dir / f"jailroot-{secrets.token_hex(4)}"
    own, other, owned_ro = base / "own", base / "other", base / "owned-ro"
    for d, owner in ((base, 0), (own, uid), (other, uid + 1), (owned_ro, uid)):
        d.mkdir(mode=0o700 if d != base else 0o711)
        os.chown(d, owner, owner)
    (other / "disk").write_text("another VM's disk")
    made_db = not cfg.db_path.exists()  # the node's database, as a node would have it
    if made_db:
        cfg.db_path.touch(mode=0o600)
    try:
        yield Layout(cfg.data_dir, own, other, owned_ro, _template_artifacts(runtime), uid)
    finally:
        remove_tree(base)
        if made_db:
            cfg.db_path.unlink()


async def _probe(layout: Layout, exists: list[str], writes: list[str]) -> dict:
    spec = jail.JailSpec(
        name=f"{layout.own.parent.name}-probe", uid=layout.uid,
        limits=Limits(memory_bytes=256 << 20, pids=16, cpus=1.0),
        log_file=layout.own / "probe.log",
        root=RootSpec(ro_paths=(*layout.artifacts, layout.owned_ro), rw_paths=(layout.own,)),
    )
    jailed = await jail.spawn(spec, ["/usr/bin/python3", "-I", "-S", "-c", PROBE,
                                     json.dumps([exists, writes, str(layout.own)])])
    try:
        assert await asyncio.wait_for(jailed.proc.wait(), 60) == 0, (
            layout.own / "probe.log").read_text()
    finally:
        await jailed.kill()
    return json.loads((layout.own / "probe.log").read_text().splitlines()[-1])


async def test_jail_sees_only_its_root(layout, runtime):
    dbs = sorted(layout.data_dir.glob("*.db"))  # every node's database, this one's too
    absent = ["/home", "/root", "/tmp", "/run", "/sys", "/var/log", "/etc/passwd",
              "/etc/shadow", "/run/netns", str(layout.other), str(layout.other / "disk"),
              *map(str, dbs), str(layout.data_dir / "templates"),
              str(layout.data_dir / "snapshots")]
    present = ["/usr/bin/qemu-system-x86_64", "/etc/ld.so.cache", "/dev/null", "/dev/urandom",
               str(layout.own), *map(str, layout.artifacts)]
    out = await _probe(layout, absent + present, [])

    assert {p for p in absent if out["exists"][p]} == set()
    assert all(out["exists"][p] for p in present), out["exists"]
    assert out["uid"] == layout.uid
    # None of the node's environment (LC_CTYPE is the probe's own Python coercing the C
    # locale; QEMU's environment is checked exactly below).
    assert {k: v for k, v in out["env"].items() if k != "LC_CTYPE"} == jail.JAIL_ENV
    assert out["etc"] == ["ld.so.cache"]
    assert out["dev"] == ["null", "urandom"]
    assert out["pids"] == ["1"]  # its own /proc: the probe is pid 1 and alone
    assert out["own"] == ["probe.log"]
    # The data directory holds only the paths to the artifacts and to its own directory.
    assert set(out["root"]) <= {"usr", "bin", "sbin", "lib", "lib64", "lib32", "libx32", "etc",
                                "dev", "proc", layout.data_dir.parts[1]}, out["root"]


async def test_jail_writes_only_its_own_directory(layout):
    kernel, tools = layout.artifacts
    writes = [str(layout.own / "new"), str(kernel), str(tools), str(layout.owned_ro / "f"),
              "/usr/x", "/x", "/etc/ld.so.cache", str(layout.other / "disk")]
    out = await _probe(layout, [], writes)
    w = out["writes"]
    assert w[str(layout.own / "new")] == "ok"
    # Owned by the jail's uid: only the read-only mount refuses it.
    assert w[str(layout.owned_ro / "f")] == errno.EROFS
    for p in (str(kernel), str(tools), "/usr/x", "/x", "/etc/ld.so.cache"):
        assert w[p] in (errno.EROFS, errno.EACCES), (p, w[p])
    assert w[str(layout.other / "disk")] == errno.ENOENT  # not there at all
    # Read-only, no setuid, no devices, and no exec outside /usr.
    mounts = {line.split()[4]: line for line in out["mounts"]}
    assert " ro," in f" {mounts['/'].split()[5]}," and "noexec" in mounts["/"]
    assert mounts["/usr"].split()[5].startswith("ro") and "nosuid" in mounts["/usr"]
    own = mounts[str(layout.own)]
    assert own.split()[5].startswith("rw") and "noexec" in own and "nodev" in own


async def test_real_qemu_runs_in_the_minimal_root(runtime, sandbox_id):
    a = await runtime.create(sandbox_id + "a", "base", AgentInit())
    b = await runtime.create(sandbox_id + "b", "base", AgentInit())
    try:
        for h, other in ((a, b), (b, a)):
            root = Path(f"/proc/{h.vmm_pid}/root")
            own = (runtime.cfg.sandboxes_dir / h.sandbox_id).resolve()  # a pooled VM's dir
            other_dir = (runtime.cfg.sandboxes_dir / other.sandbox_id).resolve()
            assert (root / own.relative_to("/") / "memory").exists()
            assert (root / own.relative_to("/") / "qmp.sock").exists()
            for gone in ("home", "root", "tmp", "run", "sys",
                         other_dir.relative_to("/"), runtime.cfg.db_path.relative_to("/")):
                assert not os.path.lexists(root / gone), gone
            assert sorted(os.listdir(root / "etc")) == ["ld.so.cache"]
            # Exactly these mounts: none of the host's others (its /run/netns, its /proc)
            # came along, so a jail pins no other namespace or filesystem.
            mounts = {line.split()[4] for line in
                      Path(f"/proc/{h.vmm_pid}/mountinfo").read_text().splitlines()}
            assert mounts == {"/", "/usr", "/etc/ld.so.cache", "/dev/null", "/dev/urandom",
                              "/proc", *map(str, _template_artifacts(runtime)), str(own),
                              str(runtime.driver.ram_shim)}
            assert [p for p in os.listdir(root / "proc") if p.isdigit()] == ["1"]
            environ = Path(f"/proc/{h.vmm_pid}/environ").read_bytes().split(b"\0")
            # PATH, malloc's tuning, and what the RAM library reads (vmm/ram.py): nothing of
            # the node's own.
            assert sorted(e.split(b"=")[0] for e in environ if e) == [
                b"AENV_RAM_CTL", b"AENV_RAM_FILE", b"GLIBC_TUNABLES", b"LD_PRELOAD", b"PATH"]
            assert b"PATH=" + jail.JAIL_ENV["PATH"].encode() in environ
    finally:
        await runtime.kill(a)
        await runtime.kill(b)


def test_roots_build_while_other_threads_fork(tmp_path: Path) -> None:
    # Jail roots are built in node threads while other threads fork jail launchers (whose
    # preexec runs between fork and exec). A fork must never make a root's read-only
    # remount fail with EBUSY: measured 101 failures in 15 s before the fix, 0 after.
    from aenv.vmm import jailroot

    spec = RootSpec(ro_paths=(Path("/etc/hostname"), Path("/etc/hosts")), rw_paths=(tmp_path,))
    errors: list[OSError] = []
    deadline = time.monotonic() + 3
    builds = 0

    def build() -> None:
        nonlocal builds
        while time.monotonic() < deadline:
            try:
                os.close(jailroot.prepare(spec))
                builds += 1
            except OSError as e:
                errors.append(e)

    builders = [threading.Thread(target=build) for _ in range(2)]
    for t in builders:
        t.start()
    while time.monotonic() < deadline:
        subprocess.run(["true"], preexec_fn=lambda: time.sleep(0.003), check=True)
    for t in builders:
        t.join()
    assert builds > 0 and not errors, errors[:3]


async def test_a_spawn_cancelled_at_any_point_leaves_nothing(layout):
    """The launcher starts from a thread (vmm/jail.py `_start`): a spawn cancelled before,
    during or after that start leaves no process of the jail and no cgroup."""
    spec = jail.JailSpec(
        name=f"{layout.own.parent.name}-cancel", uid=layout.uid,
        limits=Limits(memory_bytes=64 << 20, pids=16, cpus=1.0),
        log_file=layout.own / "cancel.log", root=RootSpec(rw_paths=(layout.own,)),
    )  # fmt: skip
    for delay in (0.0, 0.01, 0.05, 0.2, 1.0):
        task = asyncio.create_task(jail.spawn(spec, ["/usr/bin/sleep", "120"]))
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await (await task).kill()  # it was started before the cancel arrived
        deadline = time.monotonic() + 10
        while subprocess.run(["pgrep", "-u", str(layout.uid), "-x", "sleep"],
                             capture_output=True).returncode == 0:  # fmt: skip
            assert time.monotonic() < deadline, f"a jailed sleep outlived a cancel at {delay} s"
            await asyncio.sleep(0.05)
        assert not any(d.exists() for d in Cgroup(spec.name).dirs.values()), delay
