"""Tap devices via /dev/net/tun ioctls (what `ip tuntap` does, without a fork).

The tun driver binds a device to the namespace of the thread that opens /dev/net/tun, so
call these inside run_in_netns.
"""

from __future__ import annotations

import fcntl
import os
import struct

_TUNSETIFF = 0x400454CA
_TUNSETPERSIST = 0x400454CB
_TUNSETOWNER = 0x400454CC
_TUNSETGROUP = 0x400454CE
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000  # frames carry a virtio-net header (what QEMU uses when it can)


def _ifreq(name: str, flags: int) -> bytes:
    return struct.pack("16sH22x", name.encode(), flags)


def open_tap(name: str, flags: int = IFF_TAP | IFF_NO_PI) -> int:
    """Attach to (or create, non-persistent) tap `name`; returns the fd carrying frames."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, _ifreq(name, flags))
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_persistent_tap(name: str, uid: int, gid: int) -> None:
    """Create a persistent tap that uid (or gid) may attach to without CAP_NET_ADMIN, so an
    unprivileged, jailed VMM can open it by name."""
    fd = open_tap(name)
    try:
        fcntl.ioctl(fd, _TUNSETOWNER, uid)
        fcntl.ioctl(fd, _TUNSETGROUP, gid)
        fcntl.ioctl(fd, _TUNSETPERSIST, 1)
    finally:
        os.close(fd)
