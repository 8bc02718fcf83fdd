"""Density (issue 30): host memory of idle sandboxes and fork children of one snapshot.

Run as root after `aenv setup`:  .venv/bin/python bench/density.py [--quick] [--only idle,...]
It starts its own `aenv server` (bench/node.py's launcher) and drives it over the HTTP API,
running guest commands with the E2B SDK. Figures come from /proc/<qemu>/smaps: PSS splits a
page shared by n processes n ways, so a sum of PSS is what the host really holds for them.
Prints one table per part; nothing is asserted.

- idle: 1 vs 16 (`--quick`: 4) idle sandboxes of the default template, 10 s after their
  creation: the PSS of their guest-RAM mappings, of it their own written (anonymous) pages,
  and the PSS of the whole QEMU processes.
- fork: a sandbox that wrote 32 MiB of its own, measured alone; then 16 (`--quick`: 4) fork
  children of it, 10 s after the fork: the children's guest-RAM PSS against the parent's.
- pause: a sandbox writes 16 MiB, then is paused (hot) and resumed, 5 rounds: the pause's
  time at the client and the RAM it wrote back (the paused file's own extents).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory import Api, bench_node, extents, mib, ms, parse_parts, qemu_pid, table
from node import pct

from aenv import config

PARTS = ("idle", "fork", "pause")
SETTLE_S = 10.0
KIB = 1024


@dataclass
class Held:
    ram_pss: int  # the guest-RAM mapping's PSS
    ram_own: int  # of it, pages the guest wrote (anonymous)
    pss: int  # the whole QEMU process

    def __add__(self, o: Held) -> Held:
        return Held(self.ram_pss + o.ram_pss, self.ram_own + o.ram_own, self.pss + o.pss)


def held(vm_dir: Path) -> Held:
    """One VMM's memory from its smaps: its RAM mapping's (the file `vm_dir/memory`, or the
    one a save renamed over) and the whole process's."""
    pid = qemu_pid(vm_dir)
    want = {str(vm_dir / "memory"), str(vm_dir / "memory.base")}  # vmm/ram.py's two files
    ram_pss = ram_own = total = 0
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if "-" in head[0] and not head[0].endswith(":"):
            path = head[5].removesuffix(" (deleted)") if len(head) > 5 else ""
            inside = path in want
        elif line.startswith("Pss:"):
            kib = int(line.split()[1]) * KIB
            total += kib
            if inside:
                ram_pss += kib
        elif inside and line.startswith("Anonymous:"):
            ram_own += int(line.split()[1]) * KIB
    return Held(ram_pss, ram_own, total)


def held_all(api: Api, sids: list[str]) -> Held:
    out = Held(0, 0, 0)
    for s in sids:
        out = out + held(api.vm_dir(s))
    return out


def ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}x" if b else "-"


def idle(api: Api, quick: bool, template: str) -> None:
    rows, one = [], None
    for n in (1, 4 if quick else 16):
        sids: list[str] = []
        try:
            for _ in range(n):
                sids.append(api.create(template))
            time.sleep(SETTLE_S)
            h = held_all(api, sids)
            one = one or h
            rows.append([f"{n} idle", mib(h.ram_pss), ratio(h.ram_pss, one.ram_pss),
                         mib(h.ram_own / n), mib(h.pss), ratio(h.pss, one.pss),
                         mib(h.pss / n)])  # fmt: skip
        finally:
            for s in sids:
                api.kill(s)
    table(f"idle sandboxes of {template} (PSS; x = against one sandbox)",
          ["guest RAM", "x", "own each", "QEMU total", "x", "QEMU each"], rows)


def fork(api: Api, quick: bool, template: str) -> None:
    n = 4 if quick else 16
    parent = api.create(template)
    kids: list[str] = []
    try:
        api.sh(parent, "head -c 32M /dev/urandom > /dev/shm/own && sync")
        time.sleep(SETTLE_S)
        alone = held(api.vm_dir(parent))
        r = api.ok(api.c.post(f"/sandboxes/{parent}/fork", json={"count": n})).json()
        kids = [str(x["sandbox"]["sandboxID"]) for x in r if "sandbox" in x]
        if len(kids) != n:
            raise SystemExit(f"fork gave {len(kids)} of {n}: {r}")
        time.sleep(SETTLE_S)
        after = held(api.vm_dir(parent))
        h = held_all(api, kids)
        rows = [["parent alone", mib(alone.ram_pss), "1.0x", mib(alone.ram_own), mib(alone.pss)],
                ["parent after", mib(after.ram_pss), ratio(after.ram_pss, alone.ram_pss),
                 mib(after.ram_own), mib(after.pss)],
                [f"{n} children", mib(h.ram_pss), ratio(h.ram_pss, alone.ram_pss),
                 mib(h.ram_own / n), mib(h.pss)]]  # fmt: skip
    finally:
        for s in (*kids, parent):
            api.kill(s)
    table(f"a parent and {n} fork children (PSS; x = against the parent alone)",
          ["guest RAM", "x", "own (each)", "QEMU total"], rows)


def pause(api: Api, quick: bool, template: str) -> None:
    sid = api.create(template)
    pauses, resumes, own = [], [], []
    try:
        for _ in range(3 if quick else 5):
            api.sh(sid, "head -c 16M /dev/urandom > /dev/shm/dirty")
            pauses.append(api.pause(sid))
            own.append(extents(api.vm_dir(sid) / "memory").own)
            resumes.append(api.resume(sid))
    finally:
        api.kill(sid)
    table(f"pause after writing 16 MiB ({template}, p50 of {len(pauses)})",
          ["pause", "resume", "paused RAM file's own extents"],
          [["hot pause", ms(pct(pauses, 50)), ms(pct(resumes, 50)),
            mib(statistics.median(own))]])  # fmt: skip


def main() -> None:
    args, parts = parse_parts(__doc__, PARTS)
    template = config.load().default_template
    with bench_node() as api:
        for part in parts:
            {"idle": idle, "fork": fork, "pause": pause}[part](api, args.quick, template)


if __name__ == "__main__":
    main()
