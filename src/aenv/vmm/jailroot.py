"""A jail's filesystem: a private mount namespace whose root is a small read-only tmpfs
holding only what the VMM needs, each piece bind-mounted at the path it has on the host (so
every path QEMU is given resolves the same inside):

    /usr                          ro,nosuid,nodev        programs and libraries (QEMU and its
                                                         firmware, setpriv, unshare)
    /bin /sbin /lib /lib64 ...    symlinks into /usr, as on the host (merged /usr); a host
                                  that keeps them as directories gets read-only binds
    /etc/ld.so.cache              ro                     the loader's index: nothing else of /etc
    /dev/null /dev/urandom        nosuid,noexec          (+ /dev/kvm under KVM)
    RootSpec.ro_paths             ro,nosuid,nodev,noexec shared artifacts: kernel, tools drive
    RootSpec.libs                 ro,nosuid,nodev        a library QEMU preloads (vmm/ram.py)
    RootSpec.rw_paths             nosuid,nodev,noexec    the VM's own directory
    /proc                         the jail's own, mounted by the launcher in its pid namespace

Nothing else exists in there: not /home, /root, the rest of /etc, /var, /run, /sys, the host's
/proc, other VMs' directories or the node's database.

Built by plain syscalls in a short-lived thread of the node, not by helper processes (a
`mount` exec costs ~2 ms, ten of them more than QEMU's own start-up): unshare(CLONE_NEWNS) is
allowed per thread (it also unshares the thread's root and cwd), so the rest of the node
keeps the host's view. The thread returns an fd of the namespace and exits; the jail's
launcher enters it with `nsenter --mount=/proc/self/fd/N`, and the namespace lives as long
as a process in it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import stat
from dataclasses import dataclass
from pathlib import Path

from aenv.network.netns import in_fresh_thread

# Mount point of each jail's root tmpfs, inside its own namespace only: on the host it is
# an empty directory that nothing is ever mounted on.
JAIL_ROOT = Path("/run/aenv-jail")
ROOT_TMPFS_OPTS = b"mode=0755,size=1m,nr_inodes=4096"

_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
_MNT_DETACH = 2
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}  # glibc has no wrapper

SYSTEM = Path("/usr")
LOADER_CACHE = Path("/etc/ld.so.cache")
# Top-level names a merged-/usr host keeps as symlinks into /usr.
USR_LINKS = ("bin", "sbin", "lib", "lib64", "lib32", "libx32")
BASE_DEVICES = (Path("/dev/null"), Path("/dev/urandom"))

PROGRAMS = _MS_RDONLY | _MS_NOSUID | _MS_NODEV
DATA_RO = PROGRAMS | _MS_NOEXEC
DATA_RW = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
DEVICE = _MS_NOSUID | _MS_NOEXEC

_libc = ctypes.CDLL(None, use_errno=True)


class JailRootError(OSError):
    """The jail's root could not be built (a missing path, a failed mount)."""


@dataclass(frozen=True)
class RootSpec:
    """What one jail's root holds besides the system part (absolute host paths)."""

    ro_paths: tuple[Path, ...] = ()
    rw_paths: tuple[Path, ...] = ()
    devices: tuple[Path, ...] = ()
    libs: tuple[Path, ...] = ()  # read-only but executable: a preloaded library (vmm/ram.py)


@dataclass(frozen=True)
class Bind:
    path: Path  # the same on the host and in the jail
    flags: int  # per-mount flags applied right after the bind


def plan(spec: RootSpec) -> tuple[list[Bind], dict[str, str]]:
    """The bind mounts (ancestors first) and the top-level symlinks of a jail's root. A path
    already visible through a bound ancestor or a /usr symlink is not bound again."""
    links: dict[str, str] = {}
    wanted: list[Bind] = [Bind(SYSTEM, PROGRAMS), Bind(LOADER_CACHE, DATA_RO)]
    for name in USR_LINKS:
        host = Path("/") / name
        if host.is_symlink():
            links[name] = os.readlink(host)
        elif host.is_dir():
            wanted.append(Bind(host, PROGRAMS))
    wanted += [Bind(d, DEVICE) for d in (*BASE_DEVICES, *spec.devices)]
    wanted += [Bind(p, DATA_RO) for p in spec.ro_paths]
    wanted += [Bind(p, PROGRAMS) for p in spec.libs]
    wanted += [Bind(p, DATA_RW) for p in spec.rw_paths]
    covered = [Path("/") / name for name in links]
    binds: list[Bind] = []
    for b in sorted(wanted, key=lambda b: len(b.path.parts)):
        if not b.path.is_absolute():
            raise JailRootError(f"jail paths must be absolute: {b.path}")
        path = Path(os.path.normpath(b.path))
        if any(path == c or c in path.parents for c in covered):
            continue
        binds.append(Bind(path, b.flags))
        covered.append(path)
    return binds, links


def _check(rc: int, what: str, path: Path | str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise JailRootError(err, f"jail root: {what}: {os.strerror(err)}", str(path))


def _mount(src: bytes | None, dst: bytes, fstype: bytes | None, flags: int,
           data: bytes | None, path: Path | str) -> None:
    _check(_libc.mount(src, dst, fstype, flags, data), "mount", path)


def _build(binds: list[Bind], links: dict[str, str]) -> int:
    """Runs in a fresh thread: the namespace it makes is this thread's alone."""
    _check(_libc.unshare(_CLONE_NEWNS), "unshare", "/")
    fd = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        # Nothing below may propagate back to the host's mounts.
        _mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None, "/")
        root = bytes(JAIL_ROOT)
        _mount(b"aenv-jail", root, b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
               ROOT_TMPFS_OPTS, JAIL_ROOT)
        for name, target in links.items():
            os.symlink(target, JAIL_ROOT / name)
        for b in binds:
            dst = JAIL_ROOT / b.path.relative_to("/")
            if b.path.is_dir():
                dst.mkdir(parents=True, exist_ok=True)
            else:  # a file or device: bound onto an empty file
                dst.parent.mkdir(parents=True, exist_ok=True)
                # mknod, not open+close: while an fd of ours is open for writing, a fork
                # by another thread of the node (a jail launcher's, before its exec) copies
                # it, and the read-only remount of this tmpfs below fails with EBUSY.
                os.mknod(dst, 0o600 | stat.S_IFREG)
            _mount(bytes(b.path), bytes(dst), None, _MS_BIND, None, b.path)
            _mount(None, bytes(dst), None, _MS_REMOUNT | _MS_BIND | b.flags, None, b.path)
        (JAIL_ROOT / "proc").mkdir()
        # pivot_root(".", ".") stacks the old root on the new one; detaching it leaves the
        # tmpfs as "/" (pivot_root(2)).
        os.chdir(JAIL_ROOT)
        _check(_libc.syscall(_SYS_PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root",
               JAIL_ROOT)
        _check(_libc.umount2(b".", _MNT_DETACH), "detach the host's root", "/")
        os.chdir("/")
        _mount(None, b"/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
               None, "/")
    except BaseException:
        os.close(fd)
        raise
    return fd


def prepare(spec: RootSpec) -> int:
    """Build a jail's mount namespace and return an fd of it (close-on-exec: hand it to the
    launcher with pass_fds, then close it). Blocking: ~1 ms."""
    binds, links = plan(spec)
    JAIL_ROOT.mkdir(mode=0o700, parents=True, exist_ok=True)
    return in_fresh_thread(lambda: _build(binds, links), name="aenv-jailroot")
