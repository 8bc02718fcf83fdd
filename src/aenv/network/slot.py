"""One network slot: a namespace holding the guest's tap, reached from the host by a veth.

    host                     slot netns <prefix>s<i>                      guest (VM)
    <prefix><i>h 198.18.a.1 ─ veth0 198.18.a.2 ─ DNAT ─ tap0 169.254.0.22 ─ eth0 169.254.0.21

Blocking netlink/ioctl/subprocess work; callers on an event loop go through SlotPool's
async methods (asyncio.to_thread).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.nfnetlink.nfctsocket import NFCTSocket

from aenv.network import netns as ns
from aenv.network.addressing import (
    GATEWAY_ADDR,
    GUEST_ADDR,
    GUEST_MAC,
    GUEST_PREFIXLEN,
    NETNS_VETH,
    SLOT_PREFIXLEN,
    TAP_MAC,
    TAP_NAME,
    SlotNaming,
)
from aenv.network.egress import (
    EgressPolicy,
    EgressSets,
    Net,
    compile_sets,
    host_local_networks,
)
from aenv.network.rules import apply_ruleset, egress_commands, slot_ruleset
from aenv.network.tap import IFF_NO_PI, IFF_TAP, IFF_VNET_HDR, create_persistent_tap, open_tap
from aenv.vmm.base import NetAttachment

log = logging.getLogger(__name__)

_NUD_PERMANENT = 0x80
# Our links inside a slot namespace share this link group so they can be deleted in one
# batch: each separate deletion waits for RCU grace periods (~20 ms each here). An unusual
# number, so even a bug that ran the deletion in the wrong namespace would match nothing.
_LINK_GROUP = 0x61656E76  # "aenv"


@dataclass(frozen=True)
class Slot:
    index: int
    netns: str
    netns_path: Path
    tap: str
    tap_uid: int  # also used as the tap's group: the jail runs the VMM as uid = gid
    host_veth: str
    host_addr: str  # host end of the veth
    slot_addr: str  # namespace end; the host reaches the guest at slot_addr:<port>

    GUEST_ADDR: ClassVar[str] = GUEST_ADDR
    GATEWAY_ADDR: ClassVar[str] = GATEWAY_ADDR
    GUEST_MAC: ClassVar[str] = GUEST_MAC
    TAP_MAC: ClassVar[str] = TAP_MAC

    def net_attachment(self) -> NetAttachment:
        """What a VMM driver needs to plug the guest NIC into this slot."""
        return NetAttachment(netns_path=self.netns_path, tap=self.tap, mac=GUEST_MAC)

    def url(self, port: int, scheme: str = "http") -> str:
        return f"{scheme}://{self.slot_addr}:{port}"


def open_slot_tap(slot: Slot, *, vnet_hdr: bool = True) -> int:
    """Attach to the slot's tap and return the fd (close-on-exec; hand it to the VMM with
    pass_fds and `-netdev tap,fd=N,vnet_hdr=on|off`).

    Why pass an fd rather than let the VMM open tap0 by name: /dev/net/tun may be 0600
    (it is on the machine this was built on), so an unprivileged VMM could not open it, and
    with an fd the VMM need not run in the slot namespace at all. The tap owner uid still
    matters for VMMs that do open it by name.
    """
    flags = IFF_TAP | IFF_NO_PI | (IFF_VNET_HDR if vnet_hdr else 0)
    return ns.run_in_netns(slot.netns_path, open_tap, slot.tap, flags)


def slot_for(naming: SlotNaming, index: int, tap_uid: int) -> Slot:
    name = naming.netns(index)
    return Slot(
        index=index,
        netns=name,
        netns_path=ns.netns_path(name),
        tap=TAP_NAME,
        tap_uid=tap_uid,
        host_veth=naming.host_veth(index),
        host_addr=naming.host_addr(index),
        slot_addr=naming.slot_addr(index),
    )


def _ifindex(ifname: str) -> int:
    # An ioctl on a socket of the calling thread's namespace: ~50x cheaper than a netlink
    # dump through pyroute2.
    return socket.if_nametoindex(ifname)


def _configure_inside(slot: Slot, host_ns_fd: int) -> None:
    """Runs inside the new slot namespace."""
    # Forwarding only here, never on the host. No IPv6 in the slot: nothing would use it
    # and it would only widen what the guest can talk to.
    ns.write_sysctl("net.ipv4.ip_forward", "1")
    for key in ("net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"):
        with contextlib.suppress(FileNotFoundError):
            ns.write_sysctl(key, "1")

    create_persistent_tap(slot.tap, slot.tap_uid, slot.tap_uid)
    with IPRoute() as ipr:
        ipr.link("set", index=_ifindex("lo"), state="up")
        # Created from inside so the peer lands in the host directly, already named.
        ipr.link(
            "add",
            ifname=NETNS_VETH,
            kind="veth",
            peer={"ifname": slot.host_veth, "net_ns_fd": host_ns_fd},
        )
        veth = _ifindex(NETNS_VETH)
        ipr.addr("add", index=veth, address=slot.slot_addr, prefixlen=SLOT_PREFIXLEN)
        ipr.link("set", index=veth, state="up", group=_LINK_GROUP)

        tap = _ifindex(slot.tap)
        ipr.link("set", index=tap, address=TAP_MAC, group=_LINK_GROUP, state="up")
        ipr.addr("add", index=tap, address=GATEWAY_ADDR, prefixlen=GUEST_PREFIXLEN)
        # The guest MAC is fixed, so a permanent entry saves an ARP round trip on the first
        # connection after every restore and can never go stale.
        ipr.neigh("add", dst=GUEST_ADDR, lladdr=GUEST_MAC, ifindex=tap, state=_NUD_PERMANENT)
    apply_ruleset(slot_ruleset(slot.slot_addr, slot.host_addr))


def create_slot(slot: Slot) -> None:
    """Build the namespace, veth, tap and rules for slot; on failure nothing is left."""
    ns.create_netns(slot.netns)
    try:
        host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            ns.run_in_netns(slot.netns_path, _configure_inside, slot, host_fd)
        finally:
            os.close(host_fd)
        with IPRoute() as ipr:
            idx = _ifindex(slot.host_veth)
            ipr.addr("add", index=idx, address=slot.host_addr, prefixlen=SLOT_PREFIXLEN)
            ipr.link("set", index=idx, state="up")
    except BaseException:
        with contextlib.suppress(Exception):
            destroy_slot(slot.netns, slot.host_veth)
        raise


def _delete_links_inside() -> None:
    # Deleting veth0 also removes its host peer, synchronously; the persistent tap would
    # otherwise live until the kernel gets round to freeing the namespace.
    with IPRoute() as ipr:
        with contextlib.suppress(NetlinkError):
            ipr.link("del", group=_LINK_GROUP)
        # A half-built slot may have links not yet in the group.
        for name in (TAP_NAME, NETNS_VETH):
            for idx in ipr.link_lookup(ifname=name):
                with contextlib.suppress(NetlinkError):
                    ipr.link("del", index=idx)


def destroy_slot(netns_name: str, host_veth: str) -> None:
    """Remove a slot's links and namespace (idempotent; works from names alone, so it also
    cleans up after a crash)."""
    path = ns.netns_path(netns_name)
    if path.exists():
        try:
            ns.run_in_netns(path, _delete_links_inside)
        except OSError as e:  # e.g. a half-created namespace that was never mounted
            log.warning("cleaning links in %s: %s", netns_name, e)
        ns.delete_netns(netns_name)
    with IPRoute() as ipr:
        for idx in ipr.link_lookup(ifname=host_veth):
            with contextlib.suppress(NetlinkError):
                ipr.link("del", index=idx)


_DEFAULT_ROUTE = "0.0.0.0/0"
_ESRCH = 3  # netlink: no such route


def _set_egress_inside(slot: Slot, sets: EgressSets | None, proxy: tuple[int, ...] = (),
                       listener: int | None = None) -> None:  # fmt: skip
    """Open (sets) or close (None) the slot's egress. The default route exists exactly
    while the slot may be open: it goes in before the sets are filled and out before they
    are emptied, so a slot without it was never opened and closing it costs a read of
    /proc (a reset runs on every release)."""
    if sets is None and not _has_default_route():
        return
    with IPRoute() as ipr:
        if sets is not None:
            # The route out: through the host, which routes (or drops) what the rules let by.
            ipr.route("replace", dst=_DEFAULT_ROUTE, gateway=slot.host_addr)
            apply_ruleset(egress_commands(sets, proxy, listener))
            return
        try:  # no route at all while closed: a second layer under the drop rules
            ipr.route("del", dst=_DEFAULT_ROUTE)
        except NetlinkError as e:
            if e.code != _ESRCH:
                raise
    apply_ruleset(egress_commands(None))


def _has_default_route() -> bool:
    # procfs of the calling thread's namespace: ~50x cheaper than opening a netlink socket.
    for line in Path("/proc/thread-self/net/route").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == "00000000" and fields[7] == "00000000":  # destination and mask
            return True
    return False


def set_egress(slot: Slot, policy: EgressPolicy, slot_network: str,
               public: Sequence[Net] = (), *, fresh: bool = True,
               proxy: tuple[int, ...] = (), hairpin: bool = False,
               listener: int | None = None
               ) -> EgressSets | None:  # fmt: skip
    """Open the slot's egress as `policy` says, for the sandbox that holds it; `public`: the
    node's public ranges; `proxy`: the egress proxy's ports (rules.egress_commands);
    `hairpin`: whether the proxy serves the node's sandbox URLs (egress.compile_sets);
    `listener`: the slot's own listener (tunnels.py), for an egressProxy or rules. A
    closed policy needs nothing on a `fresh` start: a slot is closed from its creation and
    from every reset; a live update (`fresh=False`) may close it. The host's local
    addresses are read now (call from the host's namespace). Returns the sets applied
    (None: nothing to apply); raises OSError or RulesError."""
    if policy.is_closed and fresh:
        return None
    try:
        # A live update to closed keeps the route and fills the sets anyway: open TCP
        # connections then get their reset from the rules (no route would only drop).
        sets = compile_sets(policy, slot_network, host_local_networks(), public,
                            hairpin=hairpin and bool(proxy))
        ns.run_in_netns(slot.netns_path, _set_egress_inside, slot, sets, proxy, listener)
    except NetlinkError as e:  # callers see OSError (or RulesError) only
        raise OSError(e.code, f"egress of {slot.netns}: {e}") from e
    return sets


def _reset_inside(slot: Slot) -> None:
    # A VMM still attached would make the next one fail to attach (EBUSY): refuse, so the
    # pool destroys this slot instead of handing it out.
    os.close(open_tap(slot.tap))
    _set_egress_inside(slot, None)  # before the flush: no flow of the last tenant survives
    with NFCTSocket() as ct:
        ct.flush()


def reset_slot(slot: Slot) -> None:
    """Make a released slot fit for the next sandbox: check nothing holds its tap, close
    its egress again and forget its NAT/conntrack state. Addresses, MACs, tap and the rest
    of the rules are identical for every tenant, so they stay."""
    ns.run_in_netns(slot.netns_path, _reset_inside, slot)
