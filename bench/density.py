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
- qemu: QEMU's own memory (outside guest RAM), per component, of a sandbox idle 30 s after
  its last command (`--quick`: 10 s), running and hot-paused (its RAM released).
- tb: the TCG translation buffer's size (`tcg_tb_mib`) against QEMU's own memory and the
  time of a few commands, a node each.
- reclaim: a sandbox that wrote 64 MiB, idle until the node reclaimed it (reclaim_idle_s 3):
  the first command after, against the same command steady, with the bytes it paged in.
- idlecpu: 1 vs 32 (`--quick`: 4) idle sandboxes, 10 s after their creation: the CPU their
  VMMs use over 20 s (each, and all of them as a share of the host's cores), and the time of a
  first and a second command in one of them beside the others.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory import Api, bench_node, extents, mib, ms, parse_parts, qemu_pid, table
from node import pct

from aenv import config

PARTS = ("idle", "fork", "pause", "qemu", "tb", "reclaim", "idlecpu")
CPU_WINDOW_S = 20.0
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


# -- QEMU's own memory -------------------------------------------------------------------
COMPONENTS = ("TCG code buffer", "heap (malloc)", "other anonymous", "QEMU binary",
              "libraries", "jail launcher")


def own_memory(vm_dir: Path) -> dict[str, tuple[int, int]]:
    """QEMU's memory outside guest RAM by component: (private, PSS) bytes, from smaps."""
    pid = qemu_pid(vm_dir)
    ram = {str(vm_dir / "memory"), str(vm_dir / "memory.base")}
    out = {c: [0, 0] for c in COMPONENTS}
    part: str | None = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if "-" in head[0] and not head[0].endswith(":"):
            path = head[5].removesuffix(" (deleted)") if len(head) > 5 else ""
            part = (None if path in ram else "TCG code buffer" if head[1] == "rwxp" and not path
                    else "heap (malloc)" if path == "[heap]"
                    else "other anonymous" if not path or path.startswith("[")
                    else "QEMU binary" if "qemu-system" in path else "libraries")  # fmt: skip
        elif part and head[0] in ("Private_Clean:", "Private_Dirty:"):
            out[part][0] += int(head[1]) * KIB
        elif part and head[0] == "Pss:":
            out[part][1] += int(head[1]) * KIB
    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    for line in Path(f"/proc/{ppid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            out["jail launcher"][0] += int(line.split()[1]) * KIB
        elif line.startswith("Pss:"):
            out["jail launcher"][1] += int(line.split()[1]) * KIB
    return {c: (p, q) for c, (p, q) in out.items()}


def qemu(api: Api, quick: bool, template: str) -> None:
    sid = api.create(template)
    try:
        api.sh(sid, "python3 -c 'import json, email, asyncio' && ls -la /usr/lib > /dev/null")
        time.sleep(10 if quick else 30)
        running = own_memory(api.vm_dir(sid))
        api.pause(sid)
        time.sleep(RELEASE_WAIT_S)
        hot = own_memory(api.vm_dir(sid))
    finally:
        api.kill(sid)
    rows = [[c, mib(running[c][0]), mib(running[c][1]), mib(hot[c][0]), mib(hot[c][1])]
            for c in COMPONENTS]
    rows.append(["total", *(mib(sum(v[i] for v in d.values()))
                            for d in (running, hot) for i in (0, 1))])  # fmt: skip
    table(f"QEMU's own memory outside guest RAM ({template}, one VMM)",
          ["running private", "PSS", "hot-paused private", "PSS"], rows)


TB_COMMANDS = {"echo": "echo hi", "ls": "ls -la /usr/lib > /dev/null",
               "python import": "python3 -c 'import json, email, asyncio'",
               "pip --version": "python3 -m pip --version"}


def tb(api: Api, quick: bool, template: str) -> None:
    rows = []
    for size in (64, 32) if quick else (64, 32, 16):
        with bench_node(AENV_TCG_TB_MIB=str(size), AENV_PRIMED_POOL_SIZE="0") as a:
            sid = a.create(template)
            try:
                took = []
                for cmd in TB_COMMANDS.values():
                    times = []
                    for _ in range(3):
                        t0 = time.perf_counter()
                        a.sh(sid, cmd)
                        times.append(time.perf_counter() - t0)
                    took.append(statistics.median(times[1:]))
                time.sleep(SETTLE_S)
                own = own_memory(a.vm_dir(sid))
            finally:
                a.kill(sid)
        rows.append([f"tb-size {size} MiB", mib(own["TCG code buffer"][0]),
                     mib(sum(p for p, _ in own.values())), *(ms(t) for t in took)])
    table(f"TCG translation buffer ({template}; commands: median of the 2nd and 3rd run)",
          ["buffer", "QEMU own private", *TB_COMMANDS], rows)


RELEASE_WAIT_S = 7.0  # past hot_release_delay_s (5 s)
STEADY_CMD = "ls -la /usr/lib /etc > /dev/null && cat /etc/os-release > /dev/null"


def reclaim(api: Api, quick: bool, template: str) -> None:
    with bench_node(AENV_RECLAIM_IDLE_S="3") as a:
        sid = a.create(template)
        try:
            a.sh(sid, "head -c 64M /dev/urandom > /dev/shm/own")
            steady = []
            for _ in range(5):
                t0 = time.perf_counter()
                a.sh(sid, STEADY_CMD)
                steady.append(time.perf_counter() - t0)
            before = held(a.vm_dir(sid))
            deadline = time.monotonic() + 60
            while held(a.vm_dir(sid)).ram_own > before.ram_own // 4:
                if time.monotonic() > deadline:
                    raise SystemExit("the idle sandbox was not reclaimed in 60 s")
                time.sleep(0.5)
            pid = qemu_pid(a.vm_dir(sid))
            rss0, flt0 = ram_rss(a.vm_dir(sid)), majflt(pid)
            t0 = time.perf_counter()
            a.sh(sid, STEADY_CMD)
            first = time.perf_counter() - t0
            paged, faults = ram_rss(a.vm_dir(sid)) - rss0, majflt(pid) - flt0
        finally:
            a.kill(sid)
    table(f"first command after an idle reclaim ({template}; 64 MiB written before)",
          ["steady (p50 of 5)", "first after", "x", "paged in", "major faults"],
          [[STEADY_CMD[:24] + "...", ms(statistics.median(steady)), ms(first),
            ratio(first, statistics.median(steady)), mib(paged), str(faults)]])


def ram_rss(vm_dir: Path) -> int:
    """Resident bytes of the VMM's guest-RAM mappings."""
    pid = qemu_pid(vm_dir)
    want = {str(vm_dir / "memory"), str(vm_dir / "memory.base")}
    total, inside = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if "-" in head[0] and not head[0].endswith(":"):
            inside = (head[5].removesuffix(" (deleted)") if len(head) > 5 else "") in want
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * KIB
    return total


def majflt(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[9])


def percent(x: float) -> str:
    return f"{x * 100:.1f}%"


def idlecpu(api: Api, quick: bool, template: str) -> None:
    from aenv.machines.meter import process_cpu_s

    rows = []
    for n in (1, 4 if quick else 32):
        sids: list[str] = []
        try:
            for _ in range(n):
                sids.append(api.create(template))
            time.sleep(SETTLE_S)
            pids = [qemu_pid(api.vm_dir(s)) for s in sids]
            before = [process_cpu_s(p) for p in pids]
            time.sleep(CPU_WINDOW_S)
            used = [process_cpu_s(p) - b for p, b in zip(pids, before, strict=True)]
            each = statistics.mean(used) / CPU_WINDOW_S
            host = sum(used) / CPU_WINDOW_S / (os.cpu_count() or 1)
            t0 = time.monotonic()
            api.sh(sids[0], "echo first")
            t1 = time.monotonic()
            api.sh(sids[0], "echo second")
            t2 = time.monotonic()
            rows.append([f"{n} idle", percent(each), percent(max(used) / CPU_WINDOW_S),
                         percent(host),
                         ms(t1 - t0), ms(t2 - t1)])  # fmt: skip
        finally:
            for s in sids:
                api.kill(s)
    table(f"idle sandboxes of {template}: their VMMs' CPU (of one core; host: of all cores)",
          ["each (mean)", "each (max)", "host", "1st command", "2nd command"], rows)


def main() -> None:
    args, parts = parse_parts(__doc__, PARTS)
    template = config.load().default_template
    with bench_node() as api:
        for part in parts:
            {"idle": idle, "fork": fork, "pause": pause, "qemu": qemu, "tb": tb,
             "reclaim": reclaim, "idlecpu": idlecpu}[part](api, args.quick, template)


if __name__ == "__main__":
    main()
