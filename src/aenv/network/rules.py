"""The nftables ruleset inside a slot namespace: host -> guest DNAT, guest egress by policy.

Lives only in the slot's own namespace (never the host ruleset), in one `inet` table so
the drop rules also cover IPv6. Loaded through libnftables in-process (~1.5 ms) rather
than `nft -f -` (a fork+exec, ~6 ms); the binary is the fallback.

A fresh or reset slot lets the guest start nothing: its egress sets are empty. A sandbox's
egress policy (`egress.py`) only fills sets (`egress_commands`), in one transaction, at its
start and on every live update. Every packet the guest sends on a connection it started is
judged by the sets, so a closed destination also stops open connections: TCP gets a reset
(the guest's process sees ECONNRESET at once), anything else is dropped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import shutil
import subprocess
import threading

from aenv.network.addressing import (
    GATEWAY_ADDR,
    GUEST_ADDR,
    NETNS_VETH,
    NFS_MOUNT_PORT,
    NFS_PORT,
    TAP_NAME,
)
from aenv.network.egress import EgressSets, Net

TABLE = "aenv"
# The sets a sandbox's egress policy fills, in the order guest_egress consults them.
EGRESS_SETS = ("never", "allow_special", "special", "allow_out", "deny_out", "allow_default",
               "dns", "proxied", "hairpin")
# Guest ports whose connections the egress proxy judges by name (domains.py): HTTP, TLS.
PROXIED_PORTS = (80, 443)


class RulesError(RuntimeError):
    """nft rejected the ruleset or is missing."""


def _elements(nets: tuple[Net, ...]) -> str:
    return ", ".join(str(n) for n in nets)


def slot_ruleset(slot_addr: str, host_addr: str) -> str:
    """Rules for one fresh slot namespace; slot_addr is the namespace end of the host veth,
    host_addr the host's end.

    No `delete table` first: in the same transaction it costs ~15 ms of kernel commit time,
    and slots are only ever configured once, right after their namespace is created.
    """
    up, tap, g = NETNS_VETH, TAP_NAME, GUEST_ADDR
    sets = "\n".join(
        f"    set {name} {{ type ipv4_addr; flags interval; }}" for name in EGRESS_SETS)
    ports = ", ".join(map(str, PROXIED_PORTS))
    return f"""\
table inet {TABLE} {{
    counter guest_denied {{ }}
{sets}
    # The egress proxy's listening ports, by the guest port they stand for; filled with the
    # other sets while the policy holds a domain.
    map proxy_map {{ type inet_service : inet_service; }}
    # The guest's resolver (its resolv.conf names its gateway) -> the policy's first DNS
    # server; empty while the slot is closed.
    map dns_map {{ type ipv4_addr : ipv4_addr; }}
    set proxy_ports {{ type inet_service; }}
    # The slot's own listener (tunnels.py): for an egressProxy (socks_map) and for rules
    # (intercept_map), filled while the policy has them.
    map socks_map {{ type inet_proto : inet_service; }}
    map intercept_map {{ type inet_proto : inet_service; }}
    set listener_ports {{ type inet_service; }}
    chain prerouting {{
        type nat hook prerouting priority dstnat; policy accept;
        # The host -> slot address, any TCP port, lands on the same port in the guest. Only
        # from the host itself: were the host to forward (egress), nobody else gets in.
        iifname "{up}" ip saddr {host_addr} ip daddr {slot_addr} meta l4proto tcp dnat ip to {g}
        # With rules, HTTP and TLS go to the slot's listener, which judges and rewrites them.
        iifname "{tap}" ip saddr {g} tcp dport {{ {ports} }} ip daddr != @never \
            jump intercept_to
        # HTTP and TLS the address order would refuse go to the egress proxy (while the
        # policy holds a domain), which judges them by name.
        iifname "{tap}" ip saddr {g} tcp dport {{ {ports} }} jump proxy_pick
        iifname "{tap}" ip saddr {g} ip daddr {GATEWAY_ADDR} meta l4proto {{ tcp, udp }} \
            th dport 53 dnat ip to ip daddr map @dns_map
        # With an egressProxy, the TCP the order accepts goes to the slot's tunnel listener
        # (DNS is never tunnelled).
        iifname "{tap}" ip saddr {g} tcp dport != 53 jump socks_pick
    }}
    chain socks_pick {{
        ip daddr @never return
        ip daddr @allow_special goto socks_to
        ip daddr @special return
        ip daddr @allow_out goto socks_to
        ip daddr @deny_out return
        ip daddr @allow_default goto socks_to
    }}
    chain socks_to {{
        meta l4proto tcp redirect to : meta l4proto map @socks_map
    }}
    chain intercept_to {{
        meta l4proto tcp redirect to : meta l4proto map @intercept_map
    }}
    chain proxy_pick {{
        # The node's own addresses: its sandbox URLs (the hairpin), judged by name. Else
        # guest_egress's order: what it accepts goes direct, what it refuses to the proxy.
        ip daddr @hairpin goto proxy_to
        ip daddr @never return
        ip daddr @allow_special return
        ip daddr @special goto proxy_to
        ip daddr @allow_out return
        ip daddr @deny_out goto proxy_to
        ip daddr @allow_default return
        goto proxy_to
    }}
    chain proxy_to {{
        meta l4proto tcp ip daddr @proxied dnat ip to {host_addr} : tcp dport map @proxy_map
    }}
    chain postrouting {{
        type nat hook postrouting priority srcnat; policy accept;
        # The guest sees connections from its gateway, so it needs no route to 198.18.x.
        oifname "{tap}" ip daddr {GUEST_ADDR} masquerade
        # Allowed egress leaves as the slot address, which the host routes back here.
        oifname "{up}" ip saddr {GUEST_ADDR} snat ip to {slot_addr}
    }}
    chain forward {{
        type filter hook forward priority filter; policy drop;
        # Replies pass. The guest's own packets are judged each time (a live update closes
        # open connections too), and so is the first of each connection the host starts.
        ct state established,related ct direction reply accept
        iifname "{up}" oifname "{tap}" ip daddr {GUEST_ADDR} ct status dnat accept
        iifname "{tap}" oifname "{up}" ip saddr {g} ip daddr {host_addr} ct status dnat \
            tcp dport @proxy_ports ip daddr @proxied accept
        iifname "{tap}" oifname "{up}" ip saddr {GUEST_ADDR} jump guest_egress
        # Anything else the guest sends is refused; counted, so denied egress is observable.
        # An open TCP connection gets a reset, so its process learns at once.
        iifname "{tap}" ct state established meta l4proto tcp counter name guest_denied \
            reject with tcp reset
        iifname "{tap}" counter name guest_denied drop
    }}
    chain guest_egress {{
        # `return` = back to forward's counted drop; see egress.py for the order.
        ip daddr @never return
        ip daddr @dns meta l4proto {{ tcp, udp }} th dport 53 accept
        ip daddr @allow_special accept
        ip daddr @special return
        ip daddr @allow_out accept
        ip daddr @deny_out return
        ip daddr @allow_default accept
    }}
    chain input {{
        type filter hook input priority filter; policy accept;
        iifname "{tap}" ct state established,related accept
        iifname "{tap}" ip saddr {g} ct status dnat tcp dport @listener_ports accept
        # The slot's volume server, if it has one (nothing listens otherwise: a reset).
        iifname "{tap}" ip saddr {g} ip daddr {GATEWAY_ADDR} \
            tcp dport {{ {NFS_PORT}, {NFS_MOUNT_PORT} }} accept
        iifname "{tap}" counter name guest_denied drop
        iifname "{up}" ip saddr != {host_addr} drop
    }}
    chain egress_guard {{
        type filter hook postrouting priority srcnat + 10; policy accept;
        # Second, independent layer: nothing leaves towards the host unless it is IPv4 from
        # the slot address (replies to the host are un-DNAT-ed before this priority).
        oifname "{up}" meta nfproto ipv6 drop
        oifname "{up}" ip saddr != {slot_addr} drop
    }}
}}
"""


def egress_commands(sets: EgressSets | None, proxy: tuple[int, ...] = (),
                    listener: int | None = None) -> str:  # fmt: skip
    """One transaction that replaces the egress sets' contents (None: empty them all, the
    closed state of a fresh slot). `proxy`: the egress proxy's ports, one per
    PROXIED_PORTS entry (needed while `sets.proxied` is not empty); `listener`: the slot's
    own listener, while the policy has an egressProxy or rules."""
    lines = [f"flush set inet {TABLE} {name}" for name in EGRESS_SETS]
    lines += [f"flush map inet {TABLE} {m}"
              for m in ("proxy_map", "dns_map", "socks_map", "intercept_map")]  # fmt: skip
    lines += [f"flush set inet {TABLE} {s}" for s in ("proxy_ports", "listener_ports")]
    if sets is not None and (sets.tunnelled or sets.intercepted):
        if listener is None:
            raise RulesError("the policy needs the slot's listener, which is not open")
        lines.append(f"add element inet {TABLE} listener_ports {{ {listener} }}")
        for m, on in (("socks_map", sets.tunnelled), ("intercept_map", sets.intercepted)):
            if on:
                lines.append(f"add element inet {TABLE} {m} {{ tcp : {listener} }}")
    if sets is not None:
        if sets.resolver:
            lines.append(f"add element inet {TABLE} dns_map {{ {GATEWAY_ADDR} : {sets.resolver} }}")
        for name in EGRESS_SETS:
            nets: tuple[Net, ...] = getattr(sets, name)
            if nets:
                lines.append(f"add element inet {TABLE} {name} {{ {_elements(nets)} }}")
        if sets.proxied:
            if len(proxy) != len(PROXIED_PORTS):
                raise RulesError("the policy holds domains but no egress proxy runs")
            pairs = ", ".join(f"{g} : {p}" for g, p in zip(PROXIED_PORTS, proxy, strict=True))
            lines.append(f"add element inet {TABLE} proxy_map {{ {pairs} }}")
            lines.append(f"add element inet {TABLE} proxy_ports {{ {_elements_p(proxy)} }}")
    return "\n".join(lines) + "\n"


def _elements_p(ports: tuple[int, ...]) -> str:
    return ", ".join(map(str, ports))


class _LibNftables:
    """Minimal ctypes binding. A context's netlink socket belongs to the namespace of the
    thread that uses it, so one short-lived context per call."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        vp = ctypes.c_void_p
        lib.nft_ctx_new.argtypes, lib.nft_ctx_new.restype = [ctypes.c_uint32], vp
        lib.nft_ctx_free.argtypes = [vp]
        lib.nft_ctx_buffer_output.argtypes = [vp]
        lib.nft_ctx_buffer_error.argtypes = [vp]
        lib.nft_ctx_get_error_buffer.argtypes = [vp]
        lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
        lib.nft_run_cmd_from_buffer.argtypes = [vp, ctypes.c_char_p]
        self._lib = lib
        # libnftables keeps some process-global state (parser/GMP init); serialise use.
        self._lock = threading.Lock()

    def run(self, ruleset: str) -> None:
        lib = self._lib
        with self._lock:
            ctx = lib.nft_ctx_new(0)
            if not ctx:
                raise RulesError("nft_ctx_new failed")
            try:
                lib.nft_ctx_buffer_output(ctx)
                lib.nft_ctx_buffer_error(ctx)
                if lib.nft_run_cmd_from_buffer(ctx, ruleset.encode()) != 0:
                    err = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
                    raise RulesError(f"nftables rejected the ruleset: {err.strip()}")
            finally:
                lib.nft_ctx_free(ctx)


@functools.cache
def _libnftables() -> _LibNftables | None:
    name = ctypes.util.find_library("nftables") or "libnftables.so.1"
    try:
        return _LibNftables(ctypes.CDLL(name))
    except OSError:
        return None


def _nft_binary() -> str:
    # /usr/sbin may be missing from a service's PATH.
    candidates = [shutil.which("nft"), "/usr/sbin/nft", "/sbin/nft"]
    path = next((p for p in candidates if p and os.path.exists(p)), None)
    if path is None:
        raise RulesError("neither libnftables nor nft found: install Debian `nftables`")
    return path


def apply_ruleset(ruleset: str) -> None:
    """Load a ruleset into the calling thread's namespace (call inside run_in_netns; a
    child forked from that thread starts in that namespace too)."""
    lib = _libnftables()
    if lib is not None:
        lib.run(ruleset)
        return
    proc = subprocess.run(
        [_nft_binary(), "-f", "-"], input=ruleset, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RulesError(f"nft failed ({proc.returncode}): {proc.stderr.strip()}")
