"""Named network namespaces (iproute2-compatible: bind mounts under /run/netns).

Why not `ip netns` or pyroute2.netns: both fork (a process, or a multiprocessing child),
which costs milliseconds and is unsafe next to asyncio threads. A network namespace can be
entered by a single *thread* (setns/unshare with CLONE_NEWNET are per-task), so every
operation runs in a fresh, short-lived thread that enters the namespace, does its work and
exits. Pooled executor threads never change namespace, so nothing can leak into the host.
Netlink sockets are bound to the namespace of the thread that created them, and children
forked from such a thread start in that namespace too.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

NETNS_DIR = Path("/run/netns")

_CLONE_NEWNET = 0x40000000
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_SHARED = 0x100000
_MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_rundir_lock = threading.Lock()
_rundir_ready = False

T = TypeVar("T")


class NetnsError(OSError):
    """A namespace operation failed."""


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def _check(rc: int, what: str, name: str | Path) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise NetnsError(err, f"{what}: {os.strerror(err)}", str(name))


def _ns_inode(path: str | Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _prepare_rundir() -> None:
    """Make /run/netns a shared mount, as iproute2 does, so namespace mounts propagate
    into mount namespaces created later (e.g. a jailed VMM) and `ip netns` sees ours."""
    global _rundir_ready
    with _rundir_lock:
        if _rundir_ready:
            return
        NETNS_DIR.mkdir(parents=True, exist_ok=True)
        d = bytes(NETNS_DIR)
        if _libc.mount(b"", d, b"none", _MS_SHARED | _MS_REC, None) != 0:
            if ctypes.get_errno() != errno.EINVAL:
                _check(-1, "make /run/netns shared", NETNS_DIR)
            # EINVAL: not a mount point yet; bind it onto itself first.
            _check(_libc.mount(d, d, b"none", _MS_BIND | _MS_REC, None), "bind", NETNS_DIR)
            _check(_libc.mount(b"", d, b"none", _MS_SHARED | _MS_REC, None), "share", NETNS_DIR)
        _rundir_ready = True


def in_fresh_thread(fn: Callable[[], T], name: str = "aenv-netns") -> T:
    """Run fn in a new thread that exits afterwards, so a namespace it entered dies with it
    (also used to build a jail's mount namespace, `aenv.vmm.jailroot`)."""
    result: list[Any] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            result.append(fn())
        except BaseException as e:
            error.append(e)

    t = threading.Thread(target=body, name=name, daemon=True)
    t.start()
    t.join()
    if error:
        raise error[0]
    return result[0]


def run_in_netns(path: str | Path, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call fn(*args, **kwargs) in a fresh thread inside the namespace at path."""

    def body() -> T:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc.setns(fd, _CLONE_NEWNET), "setns", path)
        finally:
            os.close(fd)
        # Guard against ever doing namespace-local work (sysctls, conntrack flush) on the host.
        if _ns_inode("/proc/thread-self/ns/net") != _ns_inode(path):
            raise NetnsError(errno.EINVAL, "thread did not enter the namespace", str(path))
        return fn(*args, **kwargs)

    return in_fresh_thread(body)


def create_netns(name: str) -> Path:
    """Create a named namespace (fails if the name exists). Returns its path."""
    _prepare_rundir()
    path = netns_path(name)
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))

    def body() -> None:
        _check(_libc.unshare(_CLONE_NEWNET), "unshare", name)
        _check(
            _libc.mount(b"/proc/thread-self/ns/net", bytes(path), b"none", _MS_BIND, None),
            "bind namespace",
            name,
        )

    try:
        in_fresh_thread(body)
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    return path


def delete_netns(name: str) -> bool:
    """Unmount and remove a named namespace. The kernel frees it (and the virtual links in
    it) once no process or open fd holds it. Returns False if it did not exist."""
    path = netns_path(name)
    if not path.exists():
        return False
    # EINVAL = not mounted (a crash between create and bind); the file still goes.
    if _libc.umount2(bytes(path), _MNT_DETACH) != 0 and ctypes.get_errno() != errno.EINVAL:
        _check(-1, "umount", path)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return True


def list_netns(prefix: str = "") -> list[str]:
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix))


def write_sysctl(key: str, value: str) -> None:
    """Write a sysctl for the *calling thread's* namespace (net.* is per namespace).
    Only call inside run_in_netns."""
    Path("/proc/sys", *key.split(".")).write_text(value)
