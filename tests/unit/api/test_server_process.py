"""`aenv server` as a real process (fake runtime): env config, SIGTERM, restart."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(data_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "AENV_DATA_DIR": str(data_dir), "AENV_RUNTIME": "fake",
           "AENV_PORT": str(port), "AENV_API_KEY": "proc-key", "AENV_LOG_LEVEL": "debug"}
    proc = subprocess.Popen([sys.executable, "-m", "aenv.cli.main", "server"], env=env,
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError("server did not start:\n" + log.read_text())


def test_sigterm_kills_sandboxes_and_exits_0_and_kill9_leaves_nothing(tmp_path: Path) -> None:
    port, log = _port(), tmp_path / "server.log"
    proc = _start(tmp_path / "data", port, log)
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"X-API-Key": "proc-key"})
    try:
        assert api.get("/sandboxes", headers={"X-API-Key": "nope"}).status_code == 401
        sid = api.post("/v2/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        text = log.read_text()
        assert "event=node.stopped killed=1" in text
        assert "event=stage op=create stage=runtime_create" in text  # debug stage timers
        assert "proc-key" not in text  # the key is never logged

        # kill -9 with a running sandbox: the next start removes the record
        proc = _start(tmp_path / "data", port, log)
        sid = api.post("/v2/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
        proc.kill()
        proc.wait()
        proc = _start(tmp_path / "data", port, log)
        assert api.get(f"/sandboxes/{sid}").status_code == 404
        assert api.get("/v2/sandboxes").json() == []
        assert "event=recovery.removed sandbox_id=" + sid in log.read_text()
    finally:
        api.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
