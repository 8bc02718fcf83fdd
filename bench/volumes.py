"""Volumes against the rootfs, in one guest (issue 16): sequential throughput and small-file
latency, as ratios measured side by side in one run.

Run as root after `aenv setup`:  .venv/bin/python bench/volumes.py [--mib 64] [--files 200]

One node (bench/node.py's launcher), one sandbox with a volume at /mnt/v, driven by the
unmodified sync E2B SDK. A Python program in the guest times, for the rootfs
(/home/user) and the volume (/mnt/v) in turn, each round alternating which goes first:
- sequential write of `--mib` MiB in 1 MiB writes, then fsync;
- sequential read of it after dropping the guest's page cache;
- small files: create+write+close of 4 KiB each, then open+read+close of each (cache
  dropped in between), per file.
Goals: volume >= 0.5x the rootfs's sequential throughput, <= 3x its small-file latency.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from node import sdk_node  # bench/node.py: the server launcher

GUEST = r"""
import json, os, sys, time
mib, files, where = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def drop():
    os.sync(); open("/proc/sys/vm/drop_caches", "w").write("3")
d = os.path.join(where, "bench"); os.makedirs(d, exist_ok=True)
big = os.path.join(d, "big"); block = os.urandom(1 << 20)
t = time.perf_counter()
with open(big, "wb") as f:
    for _ in range(mib): f.write(block)
    f.flush(); os.fsync(f.fileno())
w = mib / (time.perf_counter() - t)
drop(); t = time.perf_counter()
with open(big, "rb") as f:
    while f.read(1 << 20): pass
r = mib / (time.perf_counter() - t)
small = os.urandom(4096); cw = []; cr = []
for i in range(files):
    t = time.perf_counter()
    with open(os.path.join(d, f"s{i}"), "wb") as f: f.write(small)
    cw.append(time.perf_counter() - t)
drop()
for i in range(files):
    t = time.perf_counter()
    with open(os.path.join(d, f"s{i}"), "rb") as f: f.read()
    cr.append(time.perf_counter() - t)
cw.sort(); cr.sort()
print(json.dumps({"write_mib_s": w, "read_mib_s": r, "create_ms": cw[len(cw)//2] * 1e3,
                  "read_small_ms": cr[len(cr)//2] * 1e3}))
import shutil; shutil.rmtree(d)
"""

ROWS = [("sequential write, MiB/s", "write_mib_s", ">= 0.5x", lambda x: x >= 0.5),
        ("sequential read, MiB/s", "read_mib_s", ">= 0.5x", lambda x: x >= 0.5),
        ("small file create+write, p50 ms", "create_ms", "<= 3x", lambda x: x <= 3),
        ("small file open+read, p50 ms", "read_small_ms", "<= 3x", lambda x: x <= 3)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with sdk_node():
        from e2b import Sandbox, Volume

        vol = Volume.create("bench-" + os.urandom(3).hex())
        sbx = Sandbox.create("base", timeout=1800, volume_mounts={"/mnt/v": vol})
        got: dict[str, list[dict[str, float]]] = {"rootfs": [], "volume": []}
        try:
            sbx.files.write("/tmp/vbench.py", GUEST)
            for i in range(args.rounds):
                order = [("rootfs", "/home/user"), ("volume", "/mnt/v")]
                for name, where in order if i % 2 == 0 else order[::-1]:
                    out = sbx.commands.run(f"python3 /tmp/vbench.py {args.mib} "
                                           f"{args.files} {where}", user="root",
                                           timeout=600).stdout  # fmt: skip
                    got[name].append(json.loads(out))
        finally:
            sbx.kill()
            Volume.destroy(vol.volume_id)
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in got.items()}
    print(f"{args.rounds} rounds, {args.mib} MiB, {args.files} files of 4 KiB (medians)")
    print("| | rootfs | volume | ratio | goal |\n|---|---|---|---|---|")
    for label, key, goal, ok in ROWS:
        ratio = med["volume"][key] / med["rootfs"][key]
        print(f"| {label} | {med['rootfs'][key]:.2f} | {med['volume'][key]:.2f} | "
              f"{ratio:.2f}x | {goal} {'met' if ok(ratio) else 'MISSED'} |")


if __name__ == "__main__":
    main()
