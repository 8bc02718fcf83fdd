"""tcpdump on loopback, for a test that searches what crossed some ports (issue 33: what
the links between a cluster's parts carry). Root and tcpdump (scripts/install-host-deps.sh)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def loopback_capture(where: Path, ports: list[int]) -> Iterator[Path]:
    """Packets to and from `ports` on `lo`, whole (snap length 0), in a pcap file that is
    complete once the block ends."""
    tcpdump = shutil.which("tcpdump")
    assert tcpdump, "no tcpdump: scripts/install-host-deps.sh installs it"
    pcap = where / "links.pcap"
    expr = " or ".join(f"tcp port {p}" for p in ports)
    # --immediate-mode: each packet as it comes (libpcap's blocks would hold the last ones
    # past the SIGINT that ends the capture).
    p = subprocess.Popen([tcpdump, "--immediate-mode", "-i", "lo", "-s", "0", "-U",
                          "-w", str(pcap), expr],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    deadline = time.monotonic() + 10
    line = p.stderr.readline()  # "listening on lo, ...": capturing from now on
    assert "listening on" in line, line
    assert time.monotonic() < deadline
    try:
        yield pcap
    finally:
        time.sleep(0.5)  # what is still on its way
        p.send_signal(signal.SIGINT)
        p.wait(timeout=10)

