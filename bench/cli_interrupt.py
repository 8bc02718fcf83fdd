"""Ctrl-C during `aenv upload`: how long the CLI takes from SIGINT to its exit.

Run as root after `aenv setup`:  .venv/bin/python bench/cli_interrupt.py [--n 20] [--hog]
A node of its own instance runs one `base` sandbox. Each round starts `aenv upload` of a
2 GiB sparse file, waits until bytes reach the sandbox, sends SIGINT and times the exit.
Half the rounds start the CLI with SIGINT ignored, as a non-interactive shell starts its `&`
jobs (the CLI must still stop). `--hog` runs `stress-ng --cpu <cores>` beside it for the
whole run. The table lists every round; a round that did not exit 130 with one line counts
as failed. Nothing is asserted: the exit status is 1 if any round failed or took over 1 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from node import Node  # bench/node.py: the server launcher

AENV = str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "aenv")
TARGET_S = 1.0


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _round(sid: str, big: Path, env: dict[str, str], ignored: bool) -> tuple[float, str]:
    subprocess.run([AENV, "exec", sid, "rm -f /tmp/big"], env=env, capture_output=True,
                   timeout=60)  # fmt: skip
    proc = subprocess.Popen([AENV, "upload", sid, str(big), "/tmp/big"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=_ignore_sigint if ignored else None)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:  # until bytes flow
            p = subprocess.run([AENV, "exec", sid, "stat -c %s /tmp/big 2>/dev/null || echo 0"],
                               env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
            if p.stdout.strip() not in ("", "0"):
                break
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            return float("inf"), "no exit in 60 s"
        took = time.perf_counter() - t0
        lines = err.decode(errors="replace").splitlines()
        ok = proc.returncode == 130 and len(lines) == 1 and "interrupted" in lines[0]
        return took, "ok" if ok else f"exit {proc.returncode}: {lines[-1:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--hog", action="store_true", help="run stress-ng --cpu beside it")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="aenv-bench-intr-"))
    hog = None
    node = Node(work / "node.log")
    try:
        if args.hog:
            if not shutil.which("stress-ng"):
                raise SystemExit("--hog needs stress-ng (apt-get install stress-ng)")
            hog = subprocess.Popen(["stress-ng", "--cpu", str(os.cpu_count() or 2), "--timeout",
                                    "3600s", "--quiet"])  # fmt: skip
        node.start()
        env = {**os.environ, "AENV_URL": node.origin, "AENV_API_KEY": node.key,
               "HOME": str(work)}  # fmt: skip
        big = work / "big"
        with big.open("wb") as f:
            f.truncate(2 << 30)
        with node.api() as c:
            r = c.post("/v2/sandboxes", json={"templateID": "base", "timeout": 1800})
            r.raise_for_status()
            sid = r.json()["sandboxID"]
        rows = []
        for i in range(args.n):
            took, result = _round(sid, big, env, ignored=i % 2 == 1)
            rows.append((i + 1, "ignored" if i % 2 else "default", took, result))
        with node.api() as c:
            c.delete(f"/sandboxes/{sid}")
    finally:
        node.stop()
        if hog is not None:
            hog.terminate()
            hog.wait()
        shutil.rmtree(work, ignore_errors=True)
    load = "with stress-ng --cpu beside it" if args.hog else "quiet machine"
    print(f"\nCtrl-C during aenv upload, {load} (target: exit within {TARGET_S:.0f} s)")
    print(f"{'round':>5}  {'SIGINT inherited':<16} {'SIGINT -> exit ms':>17}  result")
    for n, how, took, result in rows:
        print(f"{n:>5}  {how:<16} {took * 1000:>17.0f}  {result}")
    times = [r[2] for r in rows]
    print(f"p50 {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms, "
          f"failed {sum(r[3] != 'ok' for r in rows)} of {len(rows)}")  # fmt: skip
    bad = any(r[3] != "ok" or r[2] > TARGET_S for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
