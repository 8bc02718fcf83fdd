"""`aenv server` on a port that is taken: one clear line, exit 1, nothing started."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def test_taken_port_is_one_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = {**os.environ, "AENV_DATA_DIR": str(tmp_path), "AENV_API_KEY": "k",
               "AENV_INSTANCE": "porttest"}
        r = subprocess.run([sys.executable, "-m", "aenv.cli.main", "server", "--port", str(port)],
                           capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines == [f"aenv server: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert not (tmp_path / "porttest.db").exists()
