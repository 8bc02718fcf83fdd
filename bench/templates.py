"""aenv's own templates side by side (issue 35): root filesystem size, build time, create
latency, first and second `run_code` (or command) latency, and an idle sandbox's host memory.

Run as root after `aenv setup`:  .venv/bin/python bench/templates.py [--build] [TEMPLATE...]
(default: base code-interpreter-minimal code-interpreter-v1; a template not built is left
out, unless --build builds it with `aenv template build --recipe`, timed, with --force; a
template the bench built is removed after unless --keep).
The build time is the template's own (root filesystem, boot, snapshot, start command), read
from the build when --build is given. Idle memory: the sandbox's QEMU PSS and its guest RAM
mapping's PSS, 10 s after its first answer (bench/density.py's `held`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from density import SETTLE_S, held  # bench/density.py
from memory import DATA_DIR, Api, bench_node, mib, ms, table

from aenv.storage.recipes import RECIPES

DEFAULT = ("base", "code-interpreter-minimal", "code-interpreter-v1")
INTERPRETERS = {n for n, r in RECIPES.items() if r.start_cmd}


def build(name: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "aenv.cli.main", "template", "build", name,
                    "--recipe", name, "--force"], check=True)  # fmt: skip
    return time.perf_counter() - t0


def rootfs_bytes(api: Api, name: str) -> int:
    t = api.ok(api.c.get(f"/templates/{name}")).json()
    found = sorted((DATA_DIR / "templates" / t["templateID"]).glob("rootfs-*.ext4"))
    return sum(p.stat().st_blocks * 512 for p in found)


def first_answers(api: Api, name: str, sid: str) -> tuple[float, float]:
    """The first and the second answer of the template's own server (`run_code`), or of a
    command for a template without one."""
    if name in INTERPRETERS:
        from e2b_code_interpreter import Sandbox

        s = Sandbox.connect(sid)
        out = []
        for code in ("1+1", "2+2"):
            t0 = time.perf_counter()
            assert s.run_code(code).text in ("2", "4")
            out.append(time.perf_counter() - t0)
        return out[0], out[1]
    t0 = time.perf_counter()
    api.sh(sid, "true")
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    api.sh(sid, "true")
    return first, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("templates", nargs="*", default=list(DEFAULT))
    p.add_argument("--build", action="store_true")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    rows = []
    with bench_node() as api:
        names = {t["templateID"] for t in api.c.get("/templates").json()}
        built = {n: build(n) for n in args.templates if args.build and n in RECIPES}
        made = [n for n in built if n not in names]
        names |= set(built)
        for name in args.templates:
            if name not in names:
                print(f"{name}: not built (`aenv setup -t {name}`): left out")
                continue
            t0 = time.perf_counter()
            sid = api.create(name)
            create = time.perf_counter() - t0
            try:
                first, second = first_answers(api, name, sid)
                time.sleep(SETTLE_S)
                h = held(api.vm_dir(sid))
            finally:
                api.kill(sid)
            rows.append([name, mib(rootfs_bytes(api, name)),
                         f"{built[name]:.0f} s" if name in built else "-", ms(create),
                         ms(first), ms(second), mib(h.pss), mib(h.ram_pss)])  # fmt: skip
        for n in [] if args.keep else made:
            api.c.delete(f"/templates/{n}")
    table("template", ["rootfs", "build", "create", "1st answer", "2nd answer", "idle PSS",
                       "of it guest RAM"], rows)  # fmt: skip


if __name__ == "__main__":
    main()
