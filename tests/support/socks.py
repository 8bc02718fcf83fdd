"""Real SOCKS5 servers for the tests: Dante (`danted`), without credentials or with RFC 1929
ones, and stunnel in front of one for SOCKS over TLS. Started in the namespace of the
calling thread (ns.run_in_netns), as the test internet's servers are.

Dante checks a username against the system's password files, and resolves names (a CONNECT
by name) with the system's resolver. So it runs in a mount namespace of its own (unshare -m)
in which /etc/passwd, /etc/shadow and /etc/hosts are bind-mounted copies holding the test
user and the test names: the host's files are never touched."""

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

    def __init__(self, addr: str, port: int, workdir: Path, credentials: bool = False,
                 hosts: dict[str, str] | None = None) -> None:  # fmt: skip
        """`hosts`: name -> address, what a CONNECT by name resolves to."""
        self.log = workdir / f"danted-{port}.log"
        conf = workdir / f"danted-{port}.conf"
        conf.write_text(_dante_conf(addr, port, "username" if credentials else "none"))
        files = {"hosts": Path("/etc/hosts").read_text() + "".join(
            f"{a} {name}\n" for name, a in (hosts or {}).items())}
        if credentials:
            hashed = subprocess.run(["openssl", "passwd", "-6", PASSWORD], check=True,
                                    capture_output=True, text=True).stdout.strip()  # fmt: skip
            files["passwd"] = (Path("/etc/passwd").read_text()
                               + f"{USER}:x:0:0::/nonexistent:/bin/false\n")  # fmt: skip
            files["shadow"] = Path("/etc/shadow").read_text() + f"{USER}:{hashed}:19000::::::\n"
        binds = []
        for name, text in files.items():
            copy = workdir / f"danted-{port}.{name}"
            copy.write_text(text)
            copy.chmod(0o600 if name == "shadow" else 0o644)
            binds.append(f"mount --bind {copy} /etc/{name}")
        dante = f"exec danted -f {conf} -p {workdir / f'danted-{port}.pid'}"
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                " && ".join([*binds, dante])]  # fmt: skip
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
