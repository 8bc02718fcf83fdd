"""A node data directory on a small XFS image of its own, for tests that fill the disk.

The shared data directory (DATA_DIR) is one big filesystem other suites use at the same
time: filling it would break them, and its write counters are everyone's. `small_fs()` makes
`<tmp>/data` a few-GiB sparse XFS image, loop-mounted by the product's own `datafs.ensure`,
and readies it for a node:

- `artifacts/kernel` and `artifacts/tools` are symlinks to DATA_DIR's (read-only, opened by
  path, so a VM never needs them on its own filesystem), with a copy of the KVM probe cache
  so the node picks the same accelerator without probing;
- the templates asked for are copied in (template.json and the snapshot, sparse): every
  sandbox clones its template's RAM and disk by reflink, which cannot cross filesystems.

`SmallFs.node()` then runs a real `aenv server` on it with its own instance and checks after
it stopped that it left no QEMU, slot, jail or VM file behind. On exit the filesystem is
unmounted and the image deleted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aenv.network.netns import list_netns
from aenv.orchestrator.space import MIB, free_bytes
from aenv.storage import datafs
from aenv.storage.templates import TemplateCatalog
from aenv.vmm.cgroup import list_groups
from tests.support.host import DATA_DIR, free_port, qemu_pids

if TYPE_CHECKING:
    from tests.e2e.conftest import NodeProcess

FILLER = "filler"
# An umounted filesystem stays alive while mount namespaces copied from the host still
# hold it: every jail is one (`unshare --mount`), so other nodes' VMs started meanwhile pin
# it until they end. Its loop device detaches by itself then (autoclear).
DETACH_WAIT_S = 30


@dataclass
class SmallFs:
    data_dir: Path

    @property
    def image(self) -> Path:
        return datafs.image_path(self.data_dir)

    @property
    def filler(self) -> Path:
        return self.data_dir / FILLER

    # -- space -------------------------------------------------------------------------------

    def free(self) -> int:
        """Free bytes as the node's space admission sees them."""
        return free_bytes(self.data_dir)

    def fill_to(self, free: int, slack: int = MIB) -> int:
        """Grow or shrink the filler file until `free` <= free space < `free + slack`; the
        free space reached. fallocate reserves blocks without writing them, so filling a GiB
        costs metadata only."""
        fd = os.open(self.filler, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            for _ in range(20):
                now = self.free()
                if free <= now < free + slack:
                    return now
                size = os.fstat(fd).st_size
                # Aim a quarter of the slack above `free`: the filesystem's own metadata and
                # running guests move the figure a little between two reads.
                delta = now - free - slack // 4
                if delta > 0:
                    os.posix_fallocate(fd, size, delta)
                else:
                    os.ftruncate(fd, max(0, size + delta) // 4096 * 4096)
                os.fsync(fd)
            raise AssertionError(f"could not bring free space to {free >> 20} MiB: "
                                 f"{self.free() >> 20} MiB free")  # fmt: skip
        finally:
            os.close(fd)

    def unfill(self) -> None:
        """Remove the filler and wait until its blocks are free: XFS frees an unlinked
        file's blocks in the background (inode GC), after unlink returns."""
        try:
            held = self.filler.stat().st_blocks * 512
        except FileNotFoundError:
            return
        before = self.free()
        self.filler.unlink()
        deadline = time.monotonic() + 10
        while True:
            self.sync()
            if self.free() >= before + held - 16 * MIB or time.monotonic() > deadline:
                return
            time.sleep(0.05)

    def sync(self) -> None:
        """Write back this filesystem only (not the host's others)."""
        subprocess.run(["sync", "-f", str(self.data_dir)], check=True)

    # -- what is on it -------------------------------------------------------------------------

    def device(self) -> str:
        """The loop device's kernel name, e.g. `loop7`."""
        src = subprocess.run(["findmnt", "-no", "SOURCE", "--mountpoint", str(self.data_dir)],
                             capture_output=True, text=True, check=True).stdout.strip()
        return Path(src).name

    def written_bytes(self) -> int:
        """Bytes written to the filesystem's block device since it was attached (data,
        metadata and log: everything that reached the disk)."""
        fields = Path(f"/sys/block/{self.device()}/stat").read_text().split()
        return int(fields[6]) * 512  # "write sectors", always 512-byte units

    def tree(self, *parts: str) -> set[str]:
        """Paths under data_dir/parts (relative to it), for "nothing was touched" checks."""
        root = self.data_dir.joinpath(*parts)
        return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()

    # -- templates ---------------------------------------------------------------------------

    def copy_template(self, name: str) -> None:
        """A template of DATA_DIR, usable here: its template.json and its snapshot."""
        t = TemplateCatalog(DATA_DIR / "templates").get(name)
        dst = self.data_dir / "templates" / name
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copy2(DATA_DIR / "templates" / name / "template.json", dst / "template.json")
        snaps = self.data_dir / "snapshots"
        snaps.mkdir(exist_ok=True)
        # Sparse: a 4 GiB disk image and a 512 MiB RAM file hold ~80 MiB of data.
        subprocess.run(["cp", "-a", "--sparse=always", str(DATA_DIR / "snapshots" / t.snapshot_id),
                        str(snaps)], check=True)  # fmt: skip

    def build_template(self, name: str, recipe: str, memory_mib: int, log: Path) -> None:
        """`aenv template build` on this data directory (a cold boot: tens of seconds)."""
        env = {**os.environ, "AENV_DATA_DIR": str(self.data_dir), "AENV_WARM_POOL_SIZE": "0"}
        with log.open("ab") as out:
            r = subprocess.run(
                [sys.executable, "-m", "aenv.cli.main", "template", "build", name,
                 "--recipe", recipe, "--memory", str(memory_mib)],
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                timeout=900,
            )  # fmt: skip
        assert r.returncode == 0, f"template build failed:\n{log.read_text()[-3000:]}"

    # -- a node on it ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def busybox_node(self, log_dir: Path, reserve_mib: int) -> Iterator[NodeProcess]:
        """A node for the space tests: `busybox` by default, the given reserve, and no warm
        pool (every QEMU of this node is a sandbox the test made)."""
        with self.node(log_dir, AENV_DISK_RESERVE_MIB=str(reserve_mib),
                       AENV_DEFAULT_TEMPLATE="busybox", AENV_WARM_POOL_SIZE="0") as n:
            yield n

    @contextlib.contextmanager
    def node(self, log_dir: Path, **extra_env: str) -> Iterator[NodeProcess]:
        """A real node on this data directory with the E2B SDK's env pointed at it; after it
        stopped, nothing of its instance may be left on the host."""
        from tests.e2e.conftest import NodeProcess, assert_no_sandboxes, sdk_pointed_at, stop_node

        instance = "m" + os.urandom(3).hex()
        n = NodeProcess(free_port(), log_dir / "server.log", extra_env={
            "AENV_DATA_DIR": str(self.data_dir), "AENV_INSTANCE": instance, **extra_env})
        n.start()
        try:
            with sdk_pointed_at(n):
                yield n
                assert_no_sandboxes(n)
        finally:
            code = stop_node(n)
        assert code == 0, f"aenv server exit code {code}"
        self.check_nothing_left(instance)

    def check_nothing_left(self, instance: str) -> None:
        prefix = f"{instance}-"
        assert not qemu_pids(instance, self.data_dir), "QEMU processes left behind"
        assert not list_netns(prefix), f"slots left behind: {list_netns(prefix)}"
        jails = [g for g in list_groups() if g.startswith(prefix)]
        assert not jails, f"jails (cgroups) left behind: {jails}"
        files = self.tree("sandboxes", instance)
        assert not files, f"VM files left behind: {sorted(files)}"


def _attached(image: Path) -> str:
    return subprocess.run(["losetup", "-j", str(image)], capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


@contextlib.contextmanager
def small_fs(size_gib: int, templates: tuple[str, ...] = ()) -> Iterator[SmallFs]:
    """A fresh `size_gib` XFS data directory holding `templates`; gone afterwards."""
    if os.geteuid() != 0:
        import pytest

        pytest.skip("mounting a filesystem needs root")
    # Not under pytest's tmp dir (0700): jailed QEMUs (other uids) must reach their files.
    root = Path(tempfile.mkdtemp(prefix="aenv-smallfs-", dir="/var/tmp"))
    root.chmod(0o755)
    fs = SmallFs(root / "data")
    try:
        datafs.ensure(fs.data_dir, size_gib)
        arts = fs.data_dir / "artifacts"
        arts.mkdir()
        for shared in ("kernel", "tools"):
            (arts / shared).symlink_to(DATA_DIR / "artifacts" / shared)
        probe = DATA_DIR / "artifacts" / "kvm-probe.json"
        if probe.exists():
            shutil.copy2(probe, arts / probe.name)
        for name in templates:
            fs.copy_template(name)
        fs.sync()
        yield fs
    finally:
        _destroy(fs, root)


def _destroy(fs: SmallFs, root: Path) -> None:
    busy = ""
    deadline = time.monotonic() + DETACH_WAIT_S
    while datafs.is_mountpoint(fs.data_dir):
        r = subprocess.run(["umount", str(fs.data_dir)], capture_output=True, text=True)
        if r.returncode == 0:
            break
        if time.monotonic() > deadline:  # still in use: take it out of the tree anyway
            busy = r.stderr.strip()
            subprocess.run(["umount", "--lazy", str(fs.data_dir)], check=True)
            break
        time.sleep(0.5)
    while _attached(fs.image) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _attached(fs.image)
    shutil.rmtree(root)
    if left:
        # Still held by other nodes' jails (see DETACH_WAIT_S): the loop device detaches and
        # the deleted image's space returns when they end. Nothing of ours is left running.
        print(f"smallfs: {left} still attached (held by other mount namespaces); "
              "it detaches when they end")
    assert not busy, f"{fs.data_dir} was still in use at the end: {busy}"
