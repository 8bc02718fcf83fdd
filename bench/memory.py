"""Memory benchmarks (issue 5): balloon free-page reporting, pause and snapshot size vs guest
RAM, host memory of idle sandboxes restored from one template.

Run as root after `aenv setup`:  .venv/bin/python bench/memory.py [--quick] [--only balloon,...]
It starts its own `aenv server` (bench/node.py's launcher: own AENV_INSTANCE, free loopback
port) on the node's data dir and drives it over the HTTP API, running guest commands with the
E2B SDK. Host-side figures are read from /proc of each sandbox's QEMU (RSS, PSS), its jail's
cgroup, and the extents of its RAM file (FIEMAP: blocks shared with the template vs its own).
Prints one table per part; nothing is asserted.

- balloon: the guest (virtio-balloon, free-page-reporting=on) fills then frees 200 MiB of
  tmpfs; QEMU punches the reported pages out of its RAM file. Once with the guest kernel's
  default reporting order (pageblock order: 10, 4 MiB blocks) and once with order 9 (2 MiB,
  set in the guest's sysfs), to show what the granularity leaves behind (`--quick`: only
  the default).
- shapes: a 256 MiB and a 1 GiB template (busybox recipe, built with `aenv template build
  --memory` and removed after); each sandbox (created with the `memoryMB` extension) dirties
  the same 64 MiB, then is paused and resumed; then a snapshot of it.
- idle: 1 vs 16 (`--quick`: 4) idle sandboxes of the default template: QEMU PSS, cgroup
  memory, and the data filesystem blocks their RAM and disk files took of their own.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests.support

from node import DATA_DIR, Node, pct  # bench/node.py: the server launcher

from aenv import config
from aenv.vmm.cgroup import Cgroup
from tests.support.host import qemu_pids_with

MIB = 1 << 20
TTL_S = 1800
PARTS = ("balloon", "shapes", "idle")

# --- host-side views of one sandbox ------------------------------------------------------------

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_HDR = struct.Struct("=QQLLLL")  # start, length, flags, mapped, count, reserved
FIEMAP_EXT = struct.Struct("=QQQ16xL12x")  # logical, physical, length, flags
FIEMAP_FLAG_SYNC = 0x1
EXTENT_LAST, EXTENT_SHARED = 0x1, 0x2000


@dataclass
class Extents:
    count: int
    own: int  # bytes in extents no other file shares
    shared: int  # bytes still shared by reflink (with the template, a parent, a snapshot)


def extents(path: Path) -> Extents:
    """The file's extent map once its dirty pages are written back (FS_IOC_FIEMAP with
    FIEMAP_FLAG_SYNC): a guest write to a shared block takes a block of its own only at
    writeback (XFS copy-on-write), which the kernel would do within ~30 s anyway."""
    out = Extents(0, 0, 0)
    start, batch = 0, 512
    with open(path, "rb") as f:
        while True:
            buf = bytearray(FIEMAP_HDR.pack(start, (1 << 64) - 1, FIEMAP_FLAG_SYNC, 0, batch, 0)
                            + bytes(batch * FIEMAP_EXT.size))  # fmt: skip
            fcntl.ioctl(f.fileno(), FS_IOC_FIEMAP, buf)
            mapped = FIEMAP_HDR.unpack_from(buf)[3]
            if mapped == 0:
                return out
            for i in range(mapped):
                logical, _, length, flags = FIEMAP_EXT.unpack_from(
                    buf, FIEMAP_HDR.size + i * FIEMAP_EXT.size)
                out.count += 1
                if flags & EXTENT_SHARED:
                    out.shared += length
                else:
                    out.own += length
                start = logical + length
                if flags & EXTENT_LAST:
                    return out


def allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


def qemu_pid(vm_dir: Path) -> int:
    """The QEMU running the VM whose (resolved) directory is on its command line."""
    for pid in qemu_pids_with(str(vm_dir).encode() + b"/"):
        return pid
    raise LookupError(f"no QEMU for {vm_dir}")


def proc_kib(pid: int, path: str, key: str) -> int:
    for line in Path(f"/proc/{pid}/{path}").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def memcg_bytes(pid: int) -> int:
    """memory.current (v2) or usage_in_bytes (v1) of the process's aenv jail cgroup."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        path = line.split(":", 2)[2]
        if "/aenv/" in path:
            return Cgroup(path.rsplit("/", 1)[1]).memory_current()
    raise LookupError(f"pid {pid} is in no aenv cgroup")


@dataclass
class VmView:
    ram_alloc: int
    ram: Extents
    rss_file: int  # guest RAM pages QEMU has mapped (its RAM file's page cache)
    rss_anon: int  # QEMU's own memory: under TCG mostly its translation-block cache
    pss: int
    memcg: int

    @classmethod
    def read(cls, vm_dir: Path) -> VmView:
        pid = qemu_pid(vm_dir)
        ram = extents(vm_dir / "memory")  # first: its sync writes back what the guest dirtied
        return cls(allocated(vm_dir / "memory"), ram,
                   proc_kib(pid, "status", "RssFile") * 1024,
                   proc_kib(pid, "status", "RssAnon") * 1024,
                   proc_kib(pid, "smaps_rollup", "Pss") * 1024, memcg_bytes(pid))  # fmt: skip

    def cells(self) -> list[str]:
        return [mib(self.ram_alloc), mib(self.ram.own), mib(self.rss_file),
                mib(self.rss_anon), mib(self.pss), mib(self.memcg)]  # fmt: skip


VM_COLUMNS = ["RAM file alloc", "of it own", "RSS guest RAM", "RSS QEMU anon", "QEMU PSS",
              "cgroup"]

# --- output ------------------------------------------------------------------------------------


def mib(n: float) -> str:
    return f"{n / MIB:.0f} MiB"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def table(title: str, headers: list[str], rows: list[list[str]]) -> None:
    cols = [title, *headers]
    widths = [max(len(str(r[i])) for r in [cols, *rows]) for i in range(len(cols))]
    print()
    for r in [cols, *rows]:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))))  # fmt: skip


# --- the node, over its API --------------------------------------------------------------------


class Api:
    """The few control-plane calls the benches make, failing loudly on an error."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.c: httpx.Client = node.api()

    def ok(self, r: httpx.Response) -> httpx.Response:
        if r.status_code >= 300:
            raise SystemExit(f"{r.request.method} {r.request.url}: {r.status_code} {r.text}")
        return r

    def create(self, template: str, **ext: object) -> str:
        body = {"templateID": template, "timeout": TTL_S, **ext}
        r = self.ok(self.c.post("/v2/sandboxes", json=body))
        return str(r.json()["sandboxID"])

    def pause(self, sid: str) -> float:
        t0 = time.perf_counter()
        self.ok(self.c.post(f"/sandboxes/{sid}/pause", json={}))
        return time.perf_counter() - t0

    def resume(self, sid: str) -> float:
        t0 = time.perf_counter()
        r = self.ok(self.c.post(f"/v2/sandboxes/{sid}/connect", json={"timeout": TTL_S}))
        dt = time.perf_counter() - t0
        if r.status_code != 201:
            raise SystemExit(f"resume of {sid}: {r.status_code} (not paused?)")
        return dt

    def fork(self, sid: str) -> tuple[float, str]:
        t0 = time.perf_counter()
        out = self.ok(self.c.post(f"/sandboxes/{sid}/fork", json={"count": 1})).json()
        dt = time.perf_counter() - t0
        if "sandbox" not in out[0]:
            raise SystemExit(f"fork of {sid}: {out[0]}")
        return dt, str(out[0]["sandbox"]["sandboxID"])

    def snapshot(self, sid: str) -> tuple[float, str]:
        t0 = time.perf_counter()
        r = self.ok(self.c.post(f"/sandboxes/{sid}/snapshots", json={}))
        return time.perf_counter() - t0, str(r.json()["snapshotID"])

    def kill(self, sid: str) -> None:
        self.c.delete(f"/sandboxes/{sid}")

    def delete_snapshot(self, snap: str) -> None:
        self.c.delete(f"/templates/{snap}")

    def vm_dir(self, sid: str) -> Path:
        # A sandbox restored into a warm-pool VM is a symlink to the pooled directory, which
        # is the path on QEMU's command line.
        return (DATA_DIR / "sandboxes" / self.node.instance / sid).resolve()

    def sh(self, sid: str, cmd: str) -> str:
        """Run `cmd` as root in the sandbox (E2B SDK, through the node's proxy)."""
        from e2b import Sandbox

        r = Sandbox.connect(sid, timeout=TTL_S).commands.run(cmd, user="root", timeout=300)
        if r.exit_code != 0:
            raise SystemExit(f"{cmd!r} in {sid}: exit {r.exit_code}: {r.stderr}")
        return r.stdout


@contextmanager
def bench_node(**env: str) -> Iterator[Api]:
    """A node of this run's own, with the E2B SDK's env pointed at it."""
    with tempfile.TemporaryDirectory(prefix="aenv-bench-") as tmp:
        # A baseline in the same run: the node from another checkout's src (the bench's own
        # code stays this one's), e.g. `git worktree add /tmp/base <commit>`.
        base = os.environ.get("AENV_BENCH_BASELINE_SRC")
        old = {"PYTHONPATH": base} if base else {}
        node = Node(Path(tmp) / "node.log", **{"AENV_LOG_LEVEL": "info", **old, **env})
        node.start()
        os.environ.update(E2B_API_URL=node.origin, E2B_SANDBOX_URL=node.origin,
                          E2B_API_KEY=node.key)  # fmt: skip
        api = Api(node)
        try:
            yield api
            left = api.c.get("/v2/sandboxes").json()
            for s in left:  # a part that failed half-way
                api.kill(s["sandboxID"])
        finally:
            api.c.close()
            node.stop()
            # The node's log outlives the run, for a figure that needs explaining.
            shutil.copyfile(node.log, Path(tempfile.gettempdir()) / "aenv-bench-node.log")


# --- parts -------------------------------------------------------------------------------------


def settle(path: Path, window_s: float, step_s: float = 0.25) -> float:
    """Sample the file's allocation for `window_s`: seconds until it had dropped by 90% of
    what it dropped in the window (the guest reports in passes, ~2 s apart)."""
    t0 = time.perf_counter()
    samples = []
    while (now := time.perf_counter() - t0) < window_s:
        samples.append((now, allocated(path)))
        time.sleep(step_s)
    first, final = samples[0][1], samples[-1][1]
    return next(t for t, v in samples if v <= final + (first - final) / 10)


def balloon(api: Api, quick: bool, template: str) -> None:
    fill_mib = 200
    rows = []
    for order in (None,) if quick else (None, 9):
        label = "default order" if order is None else f"order {order}"
        sid = api.create(template)
        try:
            vm = api.vm_dir(sid)
            if order is not None:
                api.sh(sid, f"echo {order} > /sys/module/page_reporting/parameters/"
                            "page_reporting_order")  # fmt: skip
            cur = api.sh(sid, "cat /sys/module/page_reporting/parameters/page_reporting_order")
            label = f"{label} ({int(cur)}: {4 << int(cur) >> 10} MiB)"
            time.sleep(3)  # whatever the restore and the command freed is reported first
            rows.append([f"{label}: idle", *VmView.read(vm).cells(), ""])
            api.sh(sid, f"dd if=/dev/urandom of=/dev/shm/balloon bs=1M count={fill_mib} "
                        "2>/dev/null")  # fmt: skip
            rows.append([f"  wrote {fill_mib} MiB to guest tmpfs", *VmView.read(vm).cells(), ""])
            api.sh(sid, "rm /dev/shm/balloon")
            took = settle(vm / "memory", 10)
            rows.append(["  freed it, reported", *VmView.read(vm).cells(), ms(took)])
            free = api.sh(sid, "awk '/MemFree/ {print $2}' /proc/meminfo")
            rows[-1][0] += f" (guest MemFree {int(free) >> 10} MiB)"
            pause = api.pause(sid)
            paused = vm / "memory"
            rows.append([f"  paused ({ms(pause)})", mib(allocated(paused)),
                         mib(extents(paused).own), "", "", "", "", ""])  # fmt: skip
        finally:
            api.kill(sid)
    table("balloon free-page reporting (TCG)", [*VM_COLUMNS, "reclaimed in"], rows)
    print("reclaimed in: from the guest's `rm` returning until the RAM file's allocation "
          "had dropped by 90% of its drop in the following 10 s")


@contextmanager
def shape_templates(sizes: tuple[int, ...]) -> Iterator[dict[int, str]]:
    """Templates of these guest RAM sizes (busybox recipe), built on the node's data dir
    under names of this run's own, and removed afterwards."""
    tag = os.urandom(3).hex()
    names = {m: f"bench-mem{m}-{tag}" for m in sizes}
    env = {**os.environ, "AENV_DATA_DIR": str(DATA_DIR), "AENV_WARM_POOL_SIZE": "0"}
    cli = [sys.executable, "-m", "aenv.cli.main", "template"]
    built: list[str] = []
    try:
        for m, name in names.items():
            for attempt in (1, 2):  # a cold boot under a loaded TCG host can miss its deadline
                t0 = time.perf_counter()
                r = subprocess.run(
                    [*cli, "build", name, "--recipe", "busybox", "--memory", str(m)],
                    env=env, capture_output=True, text=True, timeout=1800,
                )  # fmt: skip
                if r.returncode == 0:
                    break
                print(f"template build {name} failed (attempt {attempt}):\n{r.stdout}{r.stderr}")
            else:
                raise SystemExit(f"template build {name} failed")
            built.append(name)
            print(f"built template {name} ({m} MiB) in {time.perf_counter() - t0:.0f} s")
        yield names
    finally:
        if built:
            subprocess.run([*cli, "rm", *built], env=env, capture_output=True, check=False)
        for name in names.values():  # what a failed build left: its rootfs image
            shutil.rmtree(DATA_DIR / "templates" / name, ignore_errors=True)


def shapes(api: Api, quick: bool) -> None:
    dirty_mib, rounds = 64, 2 if quick else 5
    rows = []
    with shape_templates((256, 1024)) as names:
        for mem, name in names.items():
            sid = api.create(name, memoryMB=mem)
            snap = None
            try:
                vm = api.vm_dir(sid)
                pauses, resumes = [], []
                for _ in range(rounds):
                    # The same 64 MiB, rewritten in place every round.
                    api.sh(sid, f"dd if=/dev/urandom of=/dev/shm/dirty bs=1M count={dirty_mib} "
                                "conv=notrunc 2>/dev/null")  # fmt: skip
                    pauses.append(api.pause(sid))
                    ram, state = extents(vm / "memory"), (vm / "state").stat().st_size
                    resumes.append(api.resume(sid))
                    vm = api.vm_dir(sid)
                dt, snap = api.snapshot(sid)
                sdir = DATA_DIR / "snapshots" / snap
                snap_alloc = sum(allocated(f) for f in sdir.iterdir() if f.is_file())
                rows.append([f"{mem} MiB guest", ms(pct(pauses, 50)), ms(pct(resumes, 50)),
                             mib(ram.own + ram.shared), mib(ram.own), f"{state >> 10} KiB",
                             ms(dt), mib(snap_alloc)])  # fmt: skip
            finally:
                api.kill(sid)
                if snap:
                    api.delete_snapshot(snap)
    table(f"pause / snapshot vs guest RAM (dirtied {dirty_mib} MiB, {rounds} rounds, p50)",
          ["pause", "resume", "paused RAM alloc", "of it own", "state", "snapshot",
           "snapshot alloc"], rows)  # fmt: skip
    print("own: extents of the paused RAM file no other file shares (not the template's); "
          "snapshot alloc: its state + memory + disk files (all reflinks of the sandbox's)")


def idle(api: Api, quick: bool, template: str) -> None:
    rows = []
    for n in (1, 4 if quick else 16):
        sids = []
        try:
            for _ in range(n):
                sids.append(api.create(template))
            time.sleep(10)  # idle: past the restore, /init and the first metrics scrape
            views = [VmView.read(api.vm_dir(s)) for s in sids]
            disks = [extents(api.vm_dir(s) / "disk") for s in sids]
            own = sum(v.ram.own for v in views) + sum(d.own for d in disks)
            pss = sum(v.pss for v in views)
            memcg = sum(v.memcg for v in views)
            anon = statistics.mean(v.rss_anon for v in views)
            rows.append([f"{n} idle sandbox{'es' if n > 1 else ''}", mib(pss), mib(pss / n),
                         mib(memcg), mib(memcg / n), mib(anon), mib(own), mib(own / n)])
        finally:
            for s in sids:
                api.kill(s)
    table(f"host memory of idle sandboxes from one template ({template})",
          ["PSS sum", "PSS each", "cgroup sum", "cgroup each", "QEMU anon mean", "data fs own",
           "own each"], rows)  # fmt: skip
    print("data fs own: RAM + disk file blocks no longer shared with the template")


def parse_parts(doc: str, all_parts: tuple[str, ...]) -> tuple[argparse.Namespace, list[str]]:
    """`--quick` and `--only a,b`: the command line of the benches made of parts."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller runs")
    ap.add_argument("--only", default=",".join(all_parts), help=f"comma-separated: {all_parts}")
    args = ap.parse_args()
    parts = args.only.split(",")
    if unknown := set(parts) - set(all_parts):
        ap.error(f"unknown parts: {unknown}")
    return args, parts


def main() -> None:
    args, parts = parse_parts(__doc__, PARTS)
    with bench_node() as api:
        template = config.load().default_template
        if "balloon" in parts:
            balloon(api, args.quick, template)
        if "shapes" in parts:
            shapes(api, args.quick)
        if "idle" in parts:
            idle(api, args.quick, template)


if __name__ == "__main__":
    main()
