"""The NFS server a sandbox mounts its volumes from: nfs-ganesha (NFSv3 over TCP, with its
own rpcbind, which ganesha cannot start without) inside the sandbox's slot namespace, at the
guest's gateway address. One per sandbox that mounts volumes, exporting only its volumes.

Why NFSv3 and one server per slot (docs/architecture.md, "Volumes"):
- v3 is stateless: a guest restored from memory in another slot, a fork's clone, or a guest
  paused for a day reconnects (a hard mount retries) and goes on with the same file handles
  (ganesha's VFS handles are the host kernel's, stable across servers on one filesystem).
- In the slot's own namespace the server is reached at a fixed address, sees one guest, and
  needs no access lists; nothing on the host listens.

Confinement: the server runs as root (it sets each request's owner) in a mount namespace
where every mount is read-only but the filesystems holding its volumes and its state
(nodev, nosuid), with a bounding set that has no CAP_MKNOD, CAP_SYS_ADMIN or
CAP_NET_ADMIN. Left open: a guest that guessed a file handle outside its export on the
volumes' filesystem (XFS handles carry a random generation number) would reach it. Its config lives
under the node's run directory (root, 0700), never in the sandbox's directory that the jailed
VMM owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from aenv.network.addressing import NFS_MOUNT_PORT, NFS_PORT

EXPORT_ROOT = "/v"  # a volume's export path (what the guest mounts): /v/<volume name>
START_TIMEOUT_S = 15.0
_CAPS = "-all,+chown,+dac_override,+dac_read_search,+fowner,+fsetid,+setgid,+setuid,+sys_resource"
BINARIES = ("ganesha.nfsd", "rpcbind", "setpriv", "unshare", "nsenter", "ss", "findmnt")


class VolumeServerError(RuntimeError):
    """The server did not start (message says why, with its log's tail)."""


@dataclass(frozen=True)
class Export:
    name: str  # the volume's name: its export is EXPORT_ROOT/<name>
    host_dir: Path


def export_path(name: str) -> str:
    return f"{EXPORT_ROOT}/{name}"


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def ganesha_config(exports: list[Export], state: Path) -> str:
    blocks = [f"""NFS_CORE_PARAM {{
    Protocols = 3; NFS_Port = {NFS_PORT}; MNT_Port = {NFS_MOUNT_PORT};
    Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false;
    mount_path_pseudo = true;
}}
NFSV4 {{ Graceless = true; RecoveryBackend = fs; RecoveryRoot = "{state}/recovery"; }}
MDCACHE {{ Entries_HWMark = 4096; }}
LOG {{ Default_Log_Level = WARN; }}
EXPORT_DEFAULTS {{
    Access_Type = RW; Squash = No_Root_Squash; SecType = sys;
    Protocols = 3; Transports = TCP;
}}"""]
    for i, e in enumerate(exports, 1):
        blocks.append(f"""EXPORT {{
    Export_Id = {i}; Path = "{e.host_dir}"; Pseudo = "{export_path(e.name)}";
    FSAL {{ Name = VFS; }}
}}""")
    return "\n".join(blocks) + "\n"


# $1: state dir; $2...: volume dirs. Runs as the process group's leader, in its own mount
# namespace (unshare -m) and the slot's network namespace (nsenter).
_SCRIPT = r"""
set -eu
state=$1; shift
# Every mount read-only here but those holding the volumes and the state directory (the
# server reaches files by handle through the filesystem's first mount, so a read-only bind
# over a volume would make it read-only too), then no device nodes or setuid on those.
keep=$(for d in "$state" "$@"; do findmnt -n -o TARGET --target "$d"; done | sort -u)
awk '{print $2}' /proc/self/mounts | sort -u | while read -r m; do
  m=$(printf '%b' "$m")
  printf '%s\n' "$keep" | grep -qxF -- "$m" && continue
  mount -o remount,bind,ro "$m" 2>/dev/null || true
done
for m in $keep; do mount -o remount,bind,nodev,nosuid "$m" 2>/dev/null || true; done
mount -t tmpfs -o mode=0755,nodev,nosuid tmpfs /run
mkdir -p /run/rpcbind
rpcbind -f &
i=0; while [ ! -S /run/rpcbind.sock ] && [ $i -lt 100 ]; do sleep 0.02; i=$((i+1)); done
exec setpriv --bounding-set "$CAPS" -- ganesha.nfsd -F -f "$state/ganesha.conf" \
  -L "$state/ganesha.log" -p "$state/ganesha.pid" -N NIV_WARN
"""


class VolumeServer:
    """One slot's server. `start` returns once it accepts NFS connections."""

    def __init__(self, netns_path: Path, state: Path, exports: list[Export]) -> None:
        self.netns_path = netns_path
        self.state = state
        self.exports = exports
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def start(self) -> None:
        if missing := missing_binaries():
            raise VolumeServerError(f"volumes need {', '.join(missing)} (nfs-ganesha, "
                                    "rpcbind: scripts/install-host-deps.sh)")  # fmt: skip
        await asyncio.to_thread(self._prepare)
        await self._reset_connections()
        self._proc = await asyncio.create_subprocess_exec(
            "nsenter", f"--net={self.netns_path}", "--", "unshare", "-m",
            "--propagation", "private", "--", "sh", "-c", _SCRIPT, "aenv-volumes",
            str(self.state), *(str(e.host_dir) for e in self.exports),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=open(self.state / "start.log", "wb"),  # noqa: SIM115 (the child holds it)
            start_new_session=True, env={"PATH": os.environ.get("PATH", ""), "CAPS": _CAPS},
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while not await asyncio.to_thread(self._listening):
            if self._proc.returncode is not None or time.monotonic() > deadline:
                why = self._tail()
                await self.stop()
                raise VolumeServerError(f"the volume server did not start: {why}")
            await asyncio.sleep(0.05)

    def _prepare(self) -> None:
        self._end_earlier()
        self.state.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.state, 0o700)
        (self.state / "recovery").mkdir(exist_ok=True)
        (self.state / "ganesha.conf").write_text(ganesha_config(self.exports, self.state))

    def _end_earlier(self) -> None:
        """End a server an earlier node process left in this slot (it would hold the port):
        the re-adoption of a running sandbox after a crash starts its server anew."""
        try:
            pid = int((self.state / "ganesha.pid").read_text().split()[0])
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            return
        if str(self.state / "ganesha.conf").encode() in argv:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.01)

    def _listening(self) -> bool:
        """Whether the server's NFS port is open in the slot (read from the namespace's
        /proc/net/tcp{,6} through the server's own process, which lives in it)."""
        if self._proc is None or self._proc.returncode is not None:
            return False
        port = f":{NFS_PORT:04X}"
        for table in ("tcp6", "tcp"):  # ganesha listens dual-stack
            try:
                lines = Path(f"/proc/{self._proc.pid}/net/{table}").read_text().splitlines()
            except OSError:
                return False
            for line in lines[1:]:
                f = line.split()
                if len(f) > 3 and f[1].endswith(port) and f[3] == "0A":  # 0A: LISTEN
                    return True
        return False

    def _tail(self) -> str:
        out = []
        for name in ("start.log", "ganesha.log"):
            with contextlib.suppress(OSError):
                text = (self.state / name).read_text(errors="replace").strip()
                if text:
                    out.append(" | ".join(text.splitlines()[-3:]))
        rc = self._proc.returncode if self._proc else None
        return "; ".join(out) or f"it exited ({rc})"

    async def stop(self) -> None:
        """End the server and its rpcbind (its process group), and remove its state."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
            # rpcbind may outlive the leader for a moment: the group goes as a whole.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        await self._reset_connections()
        await asyncio.to_thread(shutil.rmtree, self.state, True)

    async def _reset_connections(self) -> None:
        """Abort the slot's server-side sockets of an ended server (ss -K). A killed server's
        connections linger as orphans (FIN_WAIT1: a paused guest never answers their FIN);
        a guest restored or forked into the slot later sends on the same address pair (the
        NFS client reconnects from the same port, and every guest has the same address),
        hits the orphan, gets challenge ACKs instead of a reset, and would hang on it."""
        proc = await asyncio.create_subprocess_exec(
            "nsenter", f"--net={self.netns_path}", "--", "ss", "-K", "-t", "-n",
            f"( sport = :{NFS_PORT} or sport = :{NFS_MOUNT_PORT} )",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
        await proc.wait()
