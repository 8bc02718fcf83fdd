"""`aenv cluster ca init|issue` (issue 33): a CA and member certificates that verify, and bad
input as one line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


def _aenv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "aenv.cli.main", *args], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_a_ca_and_a_member_certificate_that_verifies(tmp_path: Path) -> None:
    d = tmp_path / "ca"
    assert _aenv("cluster", "ca", "init", str(d)).returncode == 0
    r = _aenv("cluster", "ca", "issue", str(d), "n1", "--host", "127.0.0.1", "--host", "n1")
    assert r.returncode == 0, r.stderr
    v = subprocess.run(["openssl", "verify", "-CAfile", str(d / "ca.pem"), str(d / "n1.pem")],
                       capture_output=True, text=True)  # fmt: skip
    assert v.returncode == 0, v.stdout + v.stderr
    assert (d / "ca.key").stat().st_mode & 0o077 == 0 and (d / "n1.key").stat().st_mode & 0o077 == 0


def test_bad_input_is_one_line_and_exit_1(tmp_path: Path) -> None:
    d = tmp_path / "ca"
    assert _aenv("cluster", "ca", "init", str(d)).returncode == 0
    before = (d / "ca.pem").read_bytes()
    for args, says in (
        (("init", str(d)), "already holds a CA"),
        (("issue", str(tmp_path / "none"), "n1", "--host", "h"), "no CA in"),
        (("issue", str(d), "bad/name", "--host", "h"), "is not a member name"),
    ):  # fmt: skip
        r = _aenv("cluster", "ca", *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], (args, r.stderr)
    assert (d / "ca.pem").read_bytes() == before  # the CA was not replaced
    assert not (d / "bad").exists()
