"""Guest-induced exhaustion, measured: one "bad" sandbox attacks its own VM while neighbour
sandboxes keep running `echo ok`. Shared by tests/e2e/test_exhaustion.py (which asserts on
it) and bench/exhaustion.py (which prints the neighbours' latencies).

The attacks, in three phases, through the unmodified e2b SDK (neighbours loop throughout):
1. memory hog: allocating past the VM's RAM until the guest OOM-kills it (first: later,
   with the page cache full of the fill's dirty pages, the OOM takes far longer under TCG);
2. disk fill: the rootfs to ENOSPC, as the user and then as root (root also takes the
   reserved blocks); most of it with fallocate, the last few hundred MiB written by dd, so
   that it takes seconds under TCG (a full dd of 4 GiB takes ~100 s);
3. fork bombs (as the user and as root) with a serial-console flood as root (straight to
   /dev/ttyS0) and kernel printk spam (`/dev/kmsg`, a fresh open per line so the per-open
   rate limit never applies), until the attack window ends. The bad guest stops answering
   here (a 1-vCPU guest flooding its 8250 console under TCG does little else); it is only
   killed afterwards.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from e2b import CommandExitException, Sandbox

NEIGHBOUR_DEADLINE_S = 10.0  # every neighbour exec must finish within this (issue 7)
PHASE_TIMEOUT_S = 120.0  # a phase run in the bad guest's foreground (TCG on a busy host)
FILL = "/var/tmp/aenv-fill"
DD_TAIL_MIB = 192  # what the user's dd writes after fallocate took the rest

FILL_DISK = (  # as the user; prints the bytes left to root afterwards (0: full)
    f"avail=$(df --output=avail -B1 / | tail -1); "
    f"fallocate -l $((avail - {DD_TAIL_MIB} * 1048576)) {FILL}-0; "
    f"dd if=/dev/zero of={FILL}-1 bs=1M 2>/dev/null; "
    f"sudo dd if=/dev/zero of={FILL}-2 bs=1M 2>/dev/null; "
    "sudo df --output=avail -B1 / | tail -1"
)
MEMORY_HOG = "python3 -c 'b = []\nwhile True: b.append(bytearray(32 << 20))'"  # as the user
OOM_KILLS = "awk '/^oom_kill /{print $2}' /sys/fs/cgroup/aenv-sandbox/memory.events"
# name -> (user, shell command), run in the background in phase 3
FLOODS: dict[str, tuple[str, str]] = {
    "fork bomb (user)": ("user", "bash -c ':(){ :|:& };:'"),
    "fork bomb (root)": ("root", "bash -c ':(){ :|:& };:'"),
    "console flood": ("root", "while :; do cat /proc/cpuinfo /proc/meminfo > /dev/ttyS0; done"),
    "printk spam": ("root", "while :; do echo '<2>aenv-exhaustion printk spam' > /dev/kmsg;"
                            " done"),
}


@dataclass
class Neighbour:
    """A sandbox running `echo ok` in a loop on its own thread until `stop` is set."""

    sbx: Sandbox
    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                r = self.sbx.commands.run("echo ok", timeout=NEIGHBOUR_DEADLINE_S,
                                          request_timeout=NEIGHBOUR_DEADLINE_S)  # fmt: skip
                took = time.monotonic() - t0
                if r.stdout != "ok\n":
                    self.failures.append(f"stdout {r.stdout!r}")
                self.latencies.append(took)
            except Exception as e:  # a timeout or an error: the neighbour was hurt
                self.failures.append(f"{type(e).__name__} after {time.monotonic() - t0:.1f}s: {e}")
            stop.wait(0.2)


@dataclass
class Outcome:
    latencies: list[float]  # every neighbour exec, seconds
    failures: list[str]
    attack_s: float
    disk_left: int  # bytes free on the bad guest's rootfs after the fill (0: full)
    oom_kills: int  # times the bad guest's OOM killer fired in phase 2

    def pct(self, p: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] if xs else float("nan")

    def table(self) -> str:
        rows = [("neighbour execs", f"{len(self.latencies)}"),
                ("failed or > 10 s", f"{len(self.failures)}"),
                ("p50 (s)", f"{self.pct(50):.3f}"), ("p99 (s)", f"{self.pct(99):.3f}"),
                ("max (s)", f"{max(self.latencies, default=float('nan')):.3f}"),
                ("mean (s)", f"{statistics.fmean(self.latencies):.3f}"
                 if self.latencies else "nan"),
                ("attack window (s)", f"{self.attack_s:.0f}"),
                ("bad guest: disk left (B)", f"{self.disk_left}"),
                ("bad guest: OOM kills", f"{self.oom_kills}")]  # fmt: skip
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v:>10}" for k, v in rows)


def _root(bad: Sandbox, cmd: str, timeout: float = 60) -> str:
    return bad.commands.run(cmd, user="root", timeout=timeout, request_timeout=timeout).stdout


def attack(bad: Sandbox) -> tuple[int, int]:
    """Phases 1 and 2, then phase 3 started (it runs on); returns (disk bytes left, OOM
    kills)."""
    with contextlib.suppress(CommandExitException):  # the hog ends OOM-killed (137)
        bad.commands.run(MEMORY_HOG, timeout=PHASE_TIMEOUT_S, request_timeout=PHASE_TIMEOUT_S)
    oom_kills = int(_root(bad, OOM_KILLS).strip() or 0)
    disk_left = int(bad.commands.run(FILL_DISK, timeout=PHASE_TIMEOUT_S,
                                     request_timeout=PHASE_TIMEOUT_S).stdout)  # fmt: skip
    for user, cmd in FLOODS.values():
        bad.commands.run(cmd, background=True, user=user, timeout=0)
    return disk_left, oom_kills


def run(bad: Sandbox, neighbours: list[Sandbox], flood_s: float) -> Outcome:
    """Neighbours loop for the whole attack: the phases, then `flood_s` of phase 3."""
    stop = threading.Event()
    ns = [Neighbour(s) for s in neighbours]
    threads = [threading.Thread(target=n.loop, args=(stop,), daemon=True) for n in ns]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    try:
        disk_left, oom_kills = attack(bad)
        stop.wait(flood_s)
    finally:
        stop.set()
        for t in threads:
            t.join(NEIGHBOUR_DEADLINE_S * 2)
    return Outcome([x for n in ns for x in n.latencies], [f for n in ns for f in n.failures],
                   time.monotonic() - t0, disk_left, oom_kills)  # fmt: skip


def vm_dir_bytes(vm_dir: Path) -> dict[str, tuple[int, int]]:
    """name -> (size, allocated bytes) of each file of a VM's directory (pooled: resolved)."""
    d = vm_dir.resolve()
    return {p.name: (p.stat().st_size, p.stat().st_blocks * 512)
            for p in d.iterdir() if p.is_file()}  # fmt: skip
