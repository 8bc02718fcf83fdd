"""Cheap commands (issue 13, item 6): `commands.run("true")` broken down, measured in one run.

Run as root after `aenv setup`:  .venv/bin/python bench/commands.py [--n 30]

One node (bench/node.py's launcher) and one sandbox, driven by the unmodified sync E2B SDK.
A small timer process inside the guest, started once, spawns the guest's own commands when
told to on its stdin, so every sample of a path through aenv is taken beside a sample of
what the guest itself needs, in the same moment:

- `commands.run("true")`: SDK -> node proxy -> agent -> `/bin/bash -l -c true`;
- Process.Start of `/bin/true` (no shell), and a small `files.read` (no process at all);
- in the guest: `bash -l -c true`, `bash -c true` and `/bin/true`, each started by the
  timer with vfork, as any small program starts a child.

aenv's overhead is `commands.run("true")` minus the guest's own `bash -l -c true` (the
issue's target: <= 15 ms p50). Nothing is asserted; the sandbox is killed.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from node import pct, sdk_node  # bench/node.py: the server launcher

TIMER = r"""
import os, subprocess, sys, time
# The environment the agent gives a command (process_service.py), not this shell's.
ENV = {k: os.environ[k] for k in ("PATH", "HOME", "USER", "LOGNAME") if k in os.environ}
CMDS = {"login": ["/bin/bash", "-l", "-c", "true"], "bash": ["/bin/bash", "-c", "true"],
        "true": ["/bin/true"]}
for line in sys.stdin:
    argv = CMDS[line.strip()]
    t0 = time.perf_counter()
    subprocess.run(argv, env=ENV, cwd=ENV.get("HOME", "/"))
    print("%.3f" % ((time.perf_counter() - t0) * 1e3), flush=True)
"""


class GuestTimer:
    """A process in the guest that times its own children (see the module docstring)."""

    def __init__(self, sbx: object) -> None:
        self.sbx = sbx
        self.out: queue.Queue[str] = queue.Queue()
        sbx.files.write("/tmp/aenv-timer.py", TIMER)  # type: ignore[attr-defined]
        self.handle = sbx.commands.run(  # type: ignore[attr-defined]
            "exec env -i PATH=\"$PATH\" HOME=\"$HOME\" USER=\"$USER\" LOGNAME=\"$LOGNAME\" "
            "python3 -u /tmp/aenv-timer.py", background=True, stdin=True, timeout=0,
        )
        # The sync SDK delivers a background command's output to whoever waits on it.
        self.reader = threading.Thread(
            target=self._read, daemon=True, name="guest-timer"
        )
        self.reader.start()

    def _read(self) -> None:
        with contextlib.suppress(Exception):  # ends when the timer is killed
            self.handle.wait(on_stdout=self._lines)

    def _lines(self, chunk: str) -> None:
        for line in chunk.splitlines():
            if line.strip():
                self.out.put(line)

    def time(self, which: str) -> float:
        self.sbx.commands.send_stdin(self.handle.pid, which + "\n")  # type: ignore[attr-defined]
        return float(self.out.get(timeout=60).strip())

    def close(self) -> None:
        self.handle.kill()


def raw_start(sbx: object, cmd: str, args: list[str]) -> Callable[[], object]:
    """Process.Start of ``cmd args`` through the SDK's own RPC client (no bash wrapper)."""
    import e2b.sandbox_sync.commands.command as cmd_mod
    from e2b.envd.process import process_pb
    from e2b.envd.utils import authentication_header

    cmds = sbx.commands  # type: ignore[attr-defined]
    request = process_pb.StartRequest(
        process=process_pb.ProcessConfig(cmd=cmd, args=args, envs={}), stdin=False
    )

    def run() -> object:
        events = cmd_mod.as_stream(cmds._rpc.start(
            request, headers=authentication_header(cmds._envd_version, None), timeout_ms=60000,
        ))  # fmt: skip
        return cmds._create_handle(events, "start process", True).wait()

    return run


def sample(n: int, paths: dict[str, Callable[[], object]], guest: GuestTimer,
           guest_cmds: list[str]) -> dict[str, list[float]]:
    series: dict[str, list[float]] = {k: [] for k in [*paths, *guest_cmds]}
    for i in range(n + 3):  # the first rounds warm connections and caches up
        for name, f in paths.items():
            t0 = time.perf_counter()
            f()
            if i >= 3:
                series[name].append((time.perf_counter() - t0) * 1e3)
        for which in guest_cmds:
            ms = guest.time(which)
            if i >= 3:
                series[which].append(ms)
    return series


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30)
    args = ap.parse_args()
    with sdk_node(E2B_DOMAIN="localhost"):
        from e2b import Sandbox

        sbx = Sandbox.create("base", timeout=1800)
        try:
            sbx.files.write("/tmp/small", "hello")
            guest = GuestTimer(sbx)
            paths = {
                "run": lambda: sbx.commands.run("true"),
                "start_true": raw_start(sbx, "/bin/true", []),
                "read": lambda: sbx.files.read("/tmp/small"),
            }
            s = sample(args.n, paths, guest, ["login", "bash", "true"])
            guest.close()
        finally:
            sbx.kill()
    p = {k: pct(v, 50) for k, v in s.items()}
    p95 = {k: pct(v, 95) for k, v in s.items()}
    rows = [
        ('commands.run("true"): SDK, proxy, agent, bash -l', "run"),
        ("in the guest: bash -l -c true", "login"),
        ("in the guest: bash -c true", "bash"),
        ("in the guest: /bin/true", "true"),
        ("Process.Start of /bin/true: SDK, proxy, agent", "start_true"),
        ("files.read of 5 bytes: SDK, proxy, agent", "read"),
    ]
    print(f"\nn={args.n} per row, interleaved; ms\n")
    print(f"{'what':<52} {'p50':>8} {'p95':>8}")
    for label, key in rows:
        print(f"{label:<52} {p[key]:8.1f} {p95[key]:8.1f}")
    print()
    print(f"{'aenv overhead: run - guest bash -l (target <= 15)':<52} "
          f"{p['run'] - p['login']:8.1f}")  # fmt: skip
    print(f"{'  of it, a process start: Start(/bin/true) - /bin/true':<52} "
          f"{p['start_true'] - p['true']:8.1f}")  # fmt: skip
    print(f"{'  of it, a round trip with no process: files.read':<52} {p['read']:8.1f}")


if __name__ == "__main__":
    main()
