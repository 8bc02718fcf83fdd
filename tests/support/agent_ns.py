"""Run the guest agent on the host, confined like a guest: its own network namespace (a
named netns with only ``lo``), its own mount, PID and UTS namespaces, a tmpfs ``/tmp``
holding a fake ``/home`` and ``/etc/passwd`` + ``/etc/group``, a private devpts, and the
tools-drive import path (the standard library, ``aenv.guest`` and ``RUNTIME_PACKAGES`` only,
under ``python3.11 -S``). The agent is PID 1 of its PID namespace, so killing it tears down
every process it started, and its mounts vanish with the mount namespace.

Clients must run inside the same netns: ``ip netns exec <netns> ...``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from aenv.storage.tools import build_exec_helper

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3.11"
AGENT_PORT = 49983
USER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

PASSWD = (
    "root:x:0:0:root:/root:/bin/bash\n"
    "user:x:1000:1000::/home/user:/bin/bash\n"
    "other:x:1001:1001::/home/other:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = "root:x:0:\nuser:x:1000:\nother:x:1001:\nnogroup:x:65534:\n"

# Runs as PID 1 of the new namespaces, then becomes the agent.
_SETUP = r"""
set -eu
mount --make-rprivate /
# The agent's view is staged on a tmpfs at /mnt first, with the repo's files bind-mounted
# (not symlinked): the repo itself may live under /tmp, which a tmpfs hides next.
mount -t tmpfs -o mode=0755,size="$AENVT_TMPFS_SIZE" aenvt-root /mnt
R=/mnt/.aenvt
mkdir -p "$R/etc" "$R/home/user" "$R/home/other" "$R/py/aenv/guest"
printf '%s' "$AENVT_PASSWD" > "$R/etc/passwd"
printf '%s' "$AENVT_GROUP" > "$R/etc/group"
chown 1000:1000 "$R/home/user"
chown 1001:1001 "$R/home/other"
cp "$AENVT_REPO/src/aenv/__init__.py" "$R/py/aenv/__init__.py"
cp "$AENVT_HELPER" "$R/aenv-exec"
mount --bind "$AENVT_REPO/src/aenv/guest" "$R/py/aenv/guest"
for p in $AENVT_PACKAGES; do
  t="$R/py/$(basename "$p")"
  if [ -d "$p" ]; then mkdir "$t"; else : > "$t"; fi
  mount --bind "$p" "$t"
done
mount -t tmpfs -o mode=1777,size="$AENVT_TMPFS_SIZE" aenvt-tmp /tmp
mount --bind "$R/etc/passwd" /etc/passwd
mount --bind "$R/etc/group" /etc/group
mount --bind "$R/home" /home
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts
mount --bind /dev/pts/ptmx /dev/ptmx
hostname sandbox
cd /
exec env -i PATH="$AENVT_PATH" PYTHONPATH="$R/py" \
    "$AENVT_PYTHON" -S -m aenv.guest.agent --host 127.0.0.1 --port "$AENVT_PORT" \
    --no-clock --no-cgroup --exec-helper "$R/aenv-exec" "$@"
"""

_WAIT_READY = r"""
import http.client, sys, time
deadline = time.monotonic() + float(sys.argv[2])
while True:
    try:
        c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=1)
        c.request("GET", "/health")
        if c.getresponse().status == 204:
            sys.exit(0)
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit(1)
    time.sleep(0.02)
"""


def runtime_package_paths() -> list[str]:
    """Site-packages paths of the agent's declared runtime packages (as the tools drive)."""
    from aenv.guest.agent.runtime_deps import RUNTIME_PACKAGES

    paths = []
    for name in RUNTIME_PACKAGES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, f"{name} is not installed"
        origin = Path(spec.origin)
        paths.append(str(origin.parent if origin.name == "__init__.py" else origin))
    return paths


@dataclass(frozen=True)
class ConfinedAgent:
    """A running confined agent. ``url`` is only reachable from inside ``netns``."""

    netns: str
    port: int
    pid: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def exec_argv(self, *argv: str) -> list[str]:
        """argv that runs a command inside the agent's network namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


@contextlib.contextmanager
def confined_agent(
    *agent_args: str, tmpfs_size: str = "512m", ready_timeout: float = 20.0
) -> Iterator[ConfinedAgent]:
    """Start the agent in fresh namespaces; everything is removed on exit, even on failure."""
    if os.geteuid() != 0:
        raise RuntimeError("confined_agent needs root (ip netns, unshare)")
    netns = f"aenvt-agent-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    proc: subprocess.Popen[bytes] | None = None
    fd, log_name = tempfile.mkstemp(prefix="aenvt-agent-", suffix=".log")
    log_path = Path(log_name)
    helper_dir = tempfile.mkdtemp(prefix="aenvt-exec-")
    try:
        # The guest's static process starter, as the tools drive has it (agent/spawn.py).
        helper = build_exec_helper(Path(helper_dir, "aenv-exec"))
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
        env = {
            "PATH": USER_PATH,
            "AENVT_TMPFS_SIZE": tmpfs_size,
            "AENVT_PASSWD": PASSWD,
            "AENVT_GROUP": GROUP,
            "AENVT_REPO": str(REPO),
            "AENVT_PACKAGES": " ".join(runtime_package_paths()),
            "AENVT_PATH": USER_PATH,
            "AENVT_PYTHON": PYTHON,
            "AENVT_PORT": str(AGENT_PORT),
            "AENVT_HELPER": str(helper),
        }
        argv = [
            "ip", "netns", "exec", netns,
            "unshare", "--mount", "--pid", "--uts", "--fork", "--mount-proc", "--kill-child",
            "/bin/sh", "-c", _SETUP, "aenvt-agent", *agent_args,
        ]  # fmt: skip
        proc = subprocess.Popen(
            argv, env=env, stdout=fd, stderr=subprocess.STDOUT, start_new_session=True
        )
        waiter = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-c", _WAIT_READY,
             str(AGENT_PORT), str(ready_timeout)],
        )  # fmt: skip
        try:
            while waiter.poll() is None and proc.poll() is None:
                time.sleep(0.02)
        finally:
            if waiter.poll() is None:
                waiter.kill()
            waiter.wait()
        if waiter.returncode != 0 or proc.poll() is not None:
            raise RuntimeError(f"agent did not become ready:\n{log_path.read_text()}")
        yield ConfinedAgent(netns=netns, port=AGENT_PORT, pid=proc.pid, log_path=log_path)
    finally:
        if proc is not None:
            _kill_group(proc)
        subprocess.run(["ip", "netns", "delete", netns], check=False)
        os.close(fd)
        log_path.unlink(missing_ok=True)
        shutil.rmtree(helper_dir, ignore_errors=True)


def wait_gone(netns: str, timeout: float = 5.0) -> bool:
    """True once ``ip netns list`` no longer shows ``netns``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        if netns not in out.split():
            return True
        time.sleep(0.05)
    return False
