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
Build time is the familiar build `aenv setup` ran: its build record's first and last log
lines (re-run it with `aenv setup --force`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from node import DATA_DIR, sdk_node  # bench/node.py: the server launcher

TEMPLATES = ("base-minimal", "base")
IMAGES = {"base-minimal": "localhost/aenv/base-minimal:latest",
          "base": "docker.io/e2bdev/base:latest"}  # fmt: skip
TOOLS = ("python3 --version", "pip --version", "node --version", "npm --version",
         "gcc --version", "make --version", "git --version", "curl --version")  # fmt: skip


def _ts(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def build_seconds(template: str) -> float | None:
    """The last successful build of `template` this node ran in full (no step from the
    step cache), first to last log line."""
    best: tuple[float, float] | None = None
    for p in (DATA_DIR / "images/builds").glob("*.json"):
        b = json.loads(p.read_text())
        if b.get("template_id") != template or b.get("status") != "ready" or not b["logs"]:
            continue
        if any(x["message"].startswith("CACHED") for x in b["logs"]):
            continue  # a rebuild from the step cache: not what building it costs
        start, end = _ts(b["logs"][0]["timestamp"]), _ts(b["logs"][-1]["timestamp"])
        if best is None or start > best[0]:
            best = (start, end - start)
    return None if best is None else best[1]


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
    args = ap.parse_args()
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
        ("build time, s", [_secs(build_seconds(t)) for t in TEMPLATES]),
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
    return "- (debootstrap, not a build)" if s is None else f"{s:.0f}"


if __name__ == "__main__":
    main()
