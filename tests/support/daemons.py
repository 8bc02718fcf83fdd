"""Helper processes of the tests (DNS, SOCKS, TLS and registry servers): started in the
namespace of the calling thread, ready once their TCP port answers, and always stopped."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path

START_DEADLINE_S = 10.0


def start_listening(args: list[str], addr: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """`args` started with its output in `log`, once `addr`:`port` accepts a connection;
    RuntimeError (with the log's end) if it exits or does not listen in time."""
    with log.open("ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{args[0]} exited: {log.read_text(errors='replace')[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection((addr, port), 0.2):
            return proc
        time.sleep(0.05)
    stop(proc)
    raise RuntimeError(f"{args[0]} did not listen on {addr}:{port}")


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
