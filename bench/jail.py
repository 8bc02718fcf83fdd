"""Jail start-up cost: launcher exec to QEMU's QMP socket answering (`QemuDriver.spawn`,
an incoming VM that waits for a restore; no network slot), and a jailed no-op process.

Run as root after `aenv setup`:  .venv/bin/python bench/jail.py [--n 20]
Uses its own instance name, so it runs next to a node. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import time
from pathlib import Path

from aenv import config as config_mod
from aenv.storage.files import remove_tree
from aenv.storage.snapshots import SnapshotStore
from aenv.storage.templates import TemplateCatalog
from aenv.vmm import jail
from aenv.vmm.base import Drive, VmSpec
from aenv.vmm.cgroup import Limits
from aenv.vmm.qemu import QemuDriver


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def main(n: int) -> None:
    instance = "b" + secrets.token_hex(3)
    cfg = config_mod.load(instance=instance)
    tpl = TemplateCatalog(cfg.templates_dir).get(cfg.default_template)
    man = SnapshotStore(cfg.snapshots_dir).get(tpl.snapshot_id)
    driver = QemuDriver(binary=cfg.qemu_binary, accel=cfg.accel, cache_dir=cfg.artifacts_dir,
                        jail_prefix=f"{instance}-")
    driver.check()
    # The top of the jail uid range: no slot of a node with the default range uses it.
    uid = cfg.jail_uid_base + cfg.jail_uid_count - 1
    cfg.sandboxes_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
    spawn_ms: list[float] = []
    noop_ms: list[float] = []
    try:
        for i in range(n):
            workdir = cfg.sandboxes_dir / f"bench{i}"
            workdir.mkdir(mode=0o700)
            os.chown(workdir, uid, uid)
            for f, mib in (("memory", man.shape.memory_mib), ("disk", man.shape.disk_mib)):
                with open(workdir / f, "wb") as fh:
                    fh.truncate(mib << 20)
                os.chown(workdir / f, uid, uid)
            spec = VmSpec(shape=man.shape, workdir=workdir, kernel=Path(man.kernel),
                          cmdline=man.cmdline, net=None, uid=uid,
                          drives=[Drive(Path(man.tools), True), Drive(workdir / "disk", False)])
            t0 = time.perf_counter()
            vm = await driver.spawn(spec, incoming=True)
            spawn_ms.append((time.perf_counter() - t0) * 1e3)
            await vm.kill()

            jspec = jail.JailSpec(name=f"{instance}-noop{i}", uid=uid,
                                  limits=Limits(256 << 20, 16, 1.0),
                                  log_file=workdir / "noop.log")
            t0 = time.perf_counter()
            j = await jail.spawn(jspec, ["/usr/bin/true"])
            await j.proc.wait()
            noop_ms.append((time.perf_counter() - t0) * 1e3)
            await j.kill()
            remove_tree(workdir)
    finally:
        remove_tree(cfg.sandboxes_dir)
    rows = [
        (f"QEMU spawn -> QMP ready (n={n}) p50", f"{statistics.median(spawn_ms):.1f} ms"),
        ("QEMU spawn -> QMP ready p95", f"{pct(spawn_ms, 95):.1f} ms"),
        (f"jailed /usr/bin/true start -> exit (n={n}) p50", f"{statistics.median(noop_ms):.1f} ms"),
        ("jailed /usr/bin/true p95", f"{pct(noop_ms, 95):.1f} ms"),
        ("accelerator", driver.accel().value),
    ]
    w = max(len(r[0]) for r in rows)
    print(f"\n{'jail benchmark'.ljust(w)}  value")
    for k, v in rows:
        print(f"{k.ljust(w)}  {v}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    asyncio.run(main(ap.parse_args().n))
