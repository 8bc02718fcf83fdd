"""Fixed guest addressing and the per-slot host-side /30s.

Every guest has the same address and MACs (so a memory snapshot restores into any slot
without stale ARP); what differs per slot is the 198.18.x.y /30 that connects the host to
the slot's namespace and is DNAT-ed to the guest.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

GUEST_ADDR = "169.254.0.21"
GATEWAY_ADDR = "169.254.0.22"  # on tap0 in the slot namespace
GUEST_PREFIXLEN = 30
GUEST_NETMASK = "255.255.255.252"
GUEST_MAC = "06:00:a9:fe:00:15"
TAP_MAC = "06:00:a9:fe:00:16"
GUEST_IFNAME = "eth0"

# The slot's volume server (volumes/server.py) at GATEWAY_ADDR: NFS and its MOUNT protocol.
NFS_PORT = 2049
NFS_MOUNT_PORT = 20048

TAP_NAME = "tap0"  # inside the slot namespace, so every slot can use the same name
NETNS_VETH = "veth0"  # namespace end of the host<->slot veth

DEFAULT_PREFIX = "aenv-"
DEFAULT_NETWORK = "198.18.0.0/15"
SLOT_PREFIXLEN = 30  # per slot: +0 network, +1 host, +2 slot, +3 broadcast

IFNAMSIZ = 15
_PREFIX_RE = re.compile(r"[a-z][a-z0-9-]*")


def guest_ip_cmdline() -> str:
    """The guest kernel `ip=` argument (IP_PNP) for the fixed in-guest address."""
    return f"ip={GUEST_ADDR}::{GATEWAY_ADDR}:{GUEST_NETMASK}::{GUEST_IFNAME}:off"


@dataclass(frozen=True)
class SlotNaming:
    """Names and addresses derived from a slot index.

    netns `<prefix>s<i>`, host veth `<prefix><i>h`: everything aenv creates starts with the
    prefix, so a census or cleanup can find it; tests use their own prefix (e.g. `aenvt-`).
    """

    prefix: str = DEFAULT_PREFIX
    network: str = DEFAULT_NETWORK

    def __post_init__(self) -> None:
        if not _PREFIX_RE.fullmatch(self.prefix):
            raise ValueError(f"bad slot prefix {self.prefix!r}")
        if len(self.host_veth(self.capacity - 1)) > IFNAMSIZ:
            raise ValueError(f"prefix {self.prefix!r} too long for interface names")
        net = ipaddress.IPv4Network(self.network)
        if net.prefixlen > SLOT_PREFIXLEN:
            raise ValueError(f"slot network {net} is smaller than one /30")

    @property
    def capacity(self) -> int:
        return ipaddress.IPv4Network(self.network).num_addresses // 4

    def netns(self, index: int) -> str:
        return f"{self.prefix}s{index}"

    def host_veth(self, index: int) -> str:
        return f"{self.prefix}{index}h"

    def _base(self, index: int) -> ipaddress.IPv4Address:
        if not 0 <= index < self.capacity:
            raise ValueError(f"slot index {index} outside {self.network}")
        return ipaddress.IPv4Network(self.network).network_address + 4 * index

    def host_addr(self, index: int) -> str:
        return str(self._base(index) + 1)

    def slot_addr(self, index: int) -> str:
        return str(self._base(index) + 2)

    def netns_index(self, name: str) -> int | None:
        m = re.fullmatch(re.escape(self.prefix) + r"s(\d+)", name)
        return int(m.group(1)) if m else None

    def veth_index(self, name: str) -> int | None:
        m = re.fullmatch(re.escape(self.prefix) + r"(\d+)h", name)
        return int(m.group(1)) if m else None
