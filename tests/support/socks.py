"""Real SOCKS5 servers for the tests: Dante (`danted`), without credentials or with RFC 1929
ones, and stunnel in front of one for SOCKS over TLS. Started in the namespace of the
calling thread (ns.run_in_netns), as the test internet's servers are.

Dante checks a username against the system's password files. The credentialed one runs in
a mount namespace of its own (unshare -m) in which /etc/passwd and /etc/shadow are
bind-mounted copies holding the test user, so the host's files are never touched."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support import daemons

USER, PASSWORD = "aenvsocks", "s0cks-pass"


def _dante_conf(addr: str, port: int, method: str) -> str:
    return (f"logoutput: stderr\ninternal: {addr} port = {port}\nexternal: {addr}\n"
            f"clientmethod: none\nsocksmethod: {method}\n"
            "user.privileged: root\nuser.unprivileged: root\n"
            "client pass { from: 0.0.0.0/0 to: 0.0.0.0/0 }\n"
            "socks pass { from: 0.0.0.0/0 to: 0.0.0.0/0 command: connect\n  log: connect }\n")


class Dante:
    """danted on `addr`:`port`; with `credentials`, it takes USER/PASSWORD only."""

    def __init__(self, addr: str, port: int, workdir: Path, credentials: bool = False) -> None:
        self.log = workdir / f"danted-{port}.log"
        conf = workdir / f"danted-{port}.conf"
        conf.write_text(_dante_conf(addr, port, "username" if credentials else "none"))
        argv = ["danted", "-f", str(conf), "-p", str(workdir / f"danted-{port}.pid")]
        if credentials:
            passwd, shadow = workdir / "passwd", workdir / "shadow"
            hashed = subprocess.run(["openssl", "passwd", "-6", PASSWORD], check=True,
                                    capture_output=True, text=True).stdout.strip()  # fmt: skip
            passwd.write_text(Path("/etc/passwd").read_text()
                              + f"{USER}:x:0:0::/nonexistent:/bin/false\n")  # fmt: skip
            shadow.write_text(Path("/etc/shadow").read_text() + f"{USER}:{hashed}:19000::::::\n")
            shadow.chmod(0o600)
            argv = ["unshare", "-m", "sh", "-c",
                    f"mount --bind {passwd} /etc/passwd && mount --bind {shadow} /etc/shadow "
                    f"&& exec {' '.join(argv)}"]  # fmt: skip
        self.proc = daemons.start_listening(argv, addr, port, self.log)

    def connects(self) -> int:
        """CONNECTs the server has passed so far."""
        text = self.log.read_text(errors="replace")
        return sum(1 for ln in text.splitlines() if "pass(1): tcp/connect" in ln)

    def close(self) -> None:
        daemons.stop(self.proc)


class Stunnel:
    """TLS on `addr`:`port` (certificate and key), relayed in the clear to `to`."""

    def __init__(self, addr: str, port: int, to: str, cert: Path, key: Path,
                 workdir: Path) -> None:  # fmt: skip
        conf = workdir / f"stunnel-{port}.conf"
        conf.write_text(f"foreground = yes\npid =\n\n[socks]\naccept = {addr}:{port}\n"
                        f"connect = {to}\ncert = {cert}\nkey = {key}\n")  # fmt: skip
        self.proc = daemons.start_listening(["stunnel4", str(conf)], addr, port,
                                            workdir / f"stunnel-{port}.log")  # fmt: skip

    def close(self) -> None:
        daemons.stop(self.proc)
