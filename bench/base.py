"""The familiar `base` against the minimal one (issue 16): what each holds, its size, its
build time and its create latency, measured side by side in one run.

Run as root after `aenv setup` (not --minimal-base):  .venv/bin/python bench/base.py

One node (bench/node.py's launcher), the unmodified sync E2B SDK. For `base-minimal` and
`base`, alternating which goes first:
- create latency: `Sandbox.create` until it returns, and until a first `commands.run`
  answers (p50 of `--creates`);
- size: bytes used on the guest's root filesystem (`df /`), and the exported image's
  compressed layer bytes (images/local.json);
- the tools a user of E2B's base image expects, with their versions.
With `--build`, each template's root filesystem is also made again into a scratch
directory on the data filesystem (its recipe on the host: `storage/rootfs.py`), timed, and
removed: the build time (boot and snapshot add ~5 s, `aenv setup` prints them).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from node import DATA_DIR, sdk_node  # bench/node.py: the server launcher

TEMPLATES = ("base-minimal", "base")
IMAGES = {"base-minimal": "localhost/aenv/base-minimal:latest",
          "base": "docker.io/e2bdev/base:latest"}  # fmt: skip
TOOLS = ("python3 --version", "pip --version", "node --version", "npm --version",
         "gcc --version", "make --version", "git --version", "curl --version")  # fmt: skip


def build_seconds(template: str) -> float:
    """Its root filesystem made again from its recipe, in a scratch directory."""
    from aenv.images.bases import RECIPES
    from aenv.storage import rootfs

    with tempfile.TemporaryDirectory(dir=DATA_DIR, prefix=".bench-rootfs-") as tmp:
        root = Path(tmp, "root")
        root.mkdir()
        t0 = time.perf_counter()
        rootfs.RECIPES[RECIPES[template]](root, Path(tmp, "build.log"), lambda _: None)
        rootfs.make_ext4(root, Path(tmp, "rootfs.ext4"), 4096, Path(tmp, "build.log"))
        return time.perf_counter() - t0


def image_bytes(template: str) -> int | None:
    local = json.loads((DATA_DIR / "images/local.json").read_text())
    rec = local.get(IMAGES[template])
    if rec is None:
        return None
    blob = DATA_DIR / "images/oci/blobs/sha256" / rec["digest"].split(":")[1]
    return sum(x["size"] for x in json.loads(blob.read_text())["layers"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--creates", type=int, default=5)
    ap.add_argument("--build", action="store_true", help="time each root filesystem's build")
    args = ap.parse_args()
    built = {t: build_seconds(t) for t in TEMPLATES} if args.build else {}
    with sdk_node():
        from e2b import Sandbox

        create: dict[str, list[float]] = {t: [] for t in TEMPLATES}
        first: dict[str, list[float]] = {t: [] for t in TEMPLATES}
        used: dict[str, int] = {}
        tools: dict[str, list[str]] = {}
        for i in range(args.creates):
            for t in TEMPLATES if i % 2 == 0 else TEMPLATES[::-1]:
                t0 = time.perf_counter()
                sbx = Sandbox.create(t, timeout=600)
                create[t].append(time.perf_counter() - t0)
                try:
                    sbx.commands.run("true")
                    first[t].append(time.perf_counter() - t0)
                    if t not in used:
                        df = sbx.commands.run("df -B1 --output=used / | tail -1").stdout
                        used[t] = int(df.strip())
                        tools[t] = [_version(sbx, cmd) for cmd in TOOLS]
                finally:
                    sbx.kill()
    print(f"{args.creates} creates of each, alternating (p50)")
    print("| | " + " | ".join(TEMPLATES) + " |\n|---|" + "---|" * len(TEMPLATES))
    rows = [
        ("create, s", [f"{statistics.median(create[t]):.2f}" for t in TEMPLATES]),
        ("create + first command, s", [f"{statistics.median(first[t]):.2f}" for t in TEMPLATES]),
        ("root filesystem used, MiB", [f"{used[t] / 2**20:.0f}" for t in TEMPLATES]),
        ("exported image (compressed), MiB", [_mib(image_bytes(t)) for t in TEMPLATES]),
        ("root filesystem build, s", [_secs(built.get(t)) for t in TEMPLATES]),
    ]
    rows += [(cmd.split()[0], [tools[t][i] for t in TEMPLATES]) for i, cmd in enumerate(TOOLS)]
    for label, cells in rows:
        print(f"| {label} | " + " | ".join(cells) + " |")


def _version(sbx: object, cmd: str) -> str:
    from e2b import CommandExitException

    try:
        out = sbx.commands.run(cmd).stdout  # type: ignore[attr-defined]
    except CommandExitException:
        return "missing"
    return out.strip().splitlines()[0][:40] if out.strip() else "?"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def _secs(s: float | None) -> str:
    return "- (--build)" if s is None else f"{s:.0f}"


if __name__ == "__main__":
    main()
