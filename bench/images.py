"""Images to templates: pull throughput, template build time, disk use and create latency.

Run as root after `aenv setup`:  .venv/bin/python bench/images.py [--mib 64] [--n 10]
A registry (Debian's docker-registry) on loopback serves images built here: a busybox base
plus a layer of `--mib` MiB of incompressible data, and `--n` images FROM that base, each
with a small layer of its own. The table shows:
- pull + convert throughput (skopeo into the image cache; MB of compressed blobs per second),
  cold and with every layer already cached;
- `aenv pull` (pull, unpack, ext4 disk, cold boot, snapshot), cold and again (up to date);
- the data filesystem bytes used by the `--n` templates (each with a `--delta-mib` layer of
  its own) against the sum of their image sizes and against base + their own deltas (the
  1.3x target): made on the base's template (layered pulls, the default) and each from a
  disk of its own (AENV_LAYERED_PULLS=0);
- create latency at the API from a pulled template against `base`.
The templates it made (and their step-cache entries) and the registry are removed at the
end; the blobs stay in the node's image cache (bounded by `image_cache_bytes`). Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from node import DATA_DIR, Node  # noqa: E402  (bench/node.py: the server launcher)

from aenv.images.cache import ImageCache  # noqa: E402
from aenv.images.reference import parse  # noqa: E402
from aenv.images.registry import RegistrySettings, Skopeo  # noqa: E402
from tests.support.image_state import removed_after  # noqa: E402
from tests.support.registry import OciImage, Registry, busybox_tree  # noqa: E402

AENV = str(ROOT / ".venv" / "bin" / "aenv")


def aenv(*args: str, env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    env = {**os.environ, "AENV_DATA_DIR": str(DATA_DIR), **(env or {})}
    p = subprocess.run([AENV, *args], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"aenv {' '.join(args)} failed: {p.stderr[-2000:]}")
    return time.perf_counter() - t0


def used_bytes() -> int:
    st = os.statvfs(DATA_DIR)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def create_ms(node: Node, template: str, n: int) -> float:
    times = []
    with node.api() as c:
        for _ in range(n):
            t0 = time.perf_counter()
            r = c.post("/v2/sandboxes", json={"templateID": template, "timeout": 60})
            times.append(time.perf_counter() - t0)
            r.raise_for_status()
            c.delete(f"/sandboxes/{r.json()['sandboxID']}")
    return statistics.median(times) * 1000


def build_rows(node: Node, base_ref: str, n: int, tag: str, names: list[str],
               delta_mib: int) -> list[tuple[str, str]]:
    """E2B builds (the SDK against the node): cold, a rebuild with the last step changed, and
    `n` templates built FROM one image, each writing `delta_mib` MiB of its own."""
    from e2b import Template

    def build(name: str, last: str) -> float:
        t = (Template().from_image(base_ref).run_cmd("echo one > /tmp/one", user="root")
             .set_envs({"K": "v"}).run_cmd(last))  # fmt: skip
        t0 = time.perf_counter()
        Template.build(t, name, api_url=node.origin, api_key=node.key)
        return time.perf_counter() - t0

    name = f"bench-build-{tag}"
    names.append(name)
    cold = build(name, "echo a > /tmp/last")
    warm = build(name, "echo b > /tmp/last")
    rows = [("Dockerfile-style build, cold (base image already a template)", f"{cold:.1f} s"),
            ("  rebuild, last step changed (step cache)", f"{warm:.1f} s ({warm / cold:.2f}x)")]
    before = used_bytes()
    for i in range(n):
        names.append(f"bench-build{i}-{tag}")
        build(names[-1], f"head -c {delta_mib << 20} /dev/urandom > /home/user/own{i}.bin")
    used = used_bytes() - before
    rows.append((f"{n} builds FROM one image ({delta_mib} MiB each): data-fs bytes used",
                 f"{used / 2**20:.0f} MiB ({used / (n * delta_mib << 20):.1f}x their own "
                 "deltas)"))
    return rows


def main() -> int:
    with removed_after():  # templates, image templates and step-cache entries it made
        return run()


def run() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64, help="size of the base image's data layer")
    ap.add_argument("--n", type=int, default=10, help="templates FROM one base")
    ap.add_argument("--delta-mib", type=int, default=1, help="each derived image's own layer")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="aenv-bench-images-"))
    reg = Registry(work / "registry").start()
    names: list[str] = []
    tag = os.urandom(3).hex()
    rows: list[tuple[str, str]] = []
    try:
        base = OciImage(work / "layout", "base")
        base.layer(busybox_tree)
        base.layer(lambda r: (r / "data.bin").write_bytes(os.urandom(args.mib << 20)))
        kids = []
        for i in range(args.n):
            kid = base.branch(f"kid{i}")
            kid.layer(lambda r, i=i: (r / f"own{i}.bin").write_bytes(
                os.urandom(args.delta_mib << 20)))
            kids.append(kid.push(reg, f"bench/kid{i}:{tag}"))
        base_ref = base.push(reg, f"bench/base:{tag}")

        cache = ImageCache(work / "cache", Skopeo(RegistrySettings(), work / "skopeo"))
        t0 = time.perf_counter()
        img = cache.pull(parse(base_ref))
        cold = time.perf_counter() - t0
        size_mb = img.size / 1e6
        rows.append(("pull into the cache, cold", f"{size_mb / cold:.0f} MB/s ({cold:.2f} s)"))
        t0 = time.perf_counter()
        cache.pull(parse(kids[0]))  # the base's blobs are cached: only the kid's layer
        warm = time.perf_counter() - t0
        rows.append(("pull, all but 1 MiB cached", f"{warm:.2f} s"))
        t0 = time.perf_counter()
        cache.unpack(img, work / "rootfs")
        rows.append(("unpack (umoci)", f"{size_mb / (time.perf_counter() - t0):.0f} MB/s"))

        name = f"bench-img-{tag}"
        names.append(name)
        for what in ("aenv pull (to template), cold", "aenv pull again (up to date)"):
            rows.append((what, f"{aenv('pull', base_ref, '--name', name):.1f} s"))

        base_bytes = img.size
        deltas = args.n * (args.delta_mib << 20)
        for how, env in (("layered on the base's template", {}),
                         ("each from a disk of its own", {"AENV_LAYERED_PULLS": "0"})):
            before = used_bytes()
            image_sum, times = 0, []
            for i, ref in enumerate(kids):
                kid_name = f"bench-kid{i}-{tag}-{len(names)}"
                names.append(kid_name)
                times.append(aenv("pull", ref, "--name", kid_name, env=env))
                image_sum += cache.pull(parse(ref)).size
            used = used_bytes() - before
            rows.append((f"{args.n} pulled templates FROM one base, {how}",
                         f"{used / 2**20:.0f} MiB, {statistics.median(times):.1f} s each"))
            rows.append(("  against the sum of their image sizes", f"{used / image_sum:.2f}x"))
            rows.append(("  against base + their deltas (target <= 1.3x)",
                         f"{used / (base_bytes + deltas):.2f}x"))  # fmt: skip

        node = Node(work / "node.log", AENV_PRIMED_POOL_SIZE="0")
        node.start()
        try:
            rows += build_rows(node, base_ref, args.n, tag, names, args.delta_mib)
            create_ms(node, name, 1)  # first restore of each pays its page cache
            rows.append(("create at the API, pulled template (p50 of 5)",
                         f"{create_ms(node, name, 5):.0f} ms"))  # fmt: skip
            rows.append(("create at the API, base (p50 of 5)",
                         f"{create_ms(node, 'base', 5):.0f} ms"))  # fmt: skip
        finally:
            node.stop()
    finally:
        reg.stop()
        shutil.rmtree(work, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"\nimages ({args.mib} MiB base layer, {args.n} derived images)")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
