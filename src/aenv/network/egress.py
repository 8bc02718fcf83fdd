"""Per-sandbox egress policy: which destinations a guest may start connections to.

By default none: the slot namespace drops every packet the guest starts (`rules.py`). A
create may open some with E2B's `network.allowOut` / `network.denyOut` (IPv4 addresses and
CIDRs) and `allow_internet_access`. A guest-started packet is judged in this order:

1. **never**: loopback, "this network", link-local (169.254/16: metadata services),
   multicast, reserved and broadcast, the node's slot network (other sandboxes and the
   host's end of every slot) and every address the host delivers locally (its interfaces,
   so the API port too) -> dropped, whatever the request says;
2. **special** ranges that are never the public internet (RFC 1918 private, 100.64/10
   shared, 192.0.0/24, the documentation nets, the rest of 198.18/15) -> dropped unless an
   `allowOut` entry lies inside one (a destination named on purpose): a wider entry such
   as 0.0.0.0/0 does not open them;
3. `allowOut` -> accepted (allow wins over deny, as in E2B);
4. `denyOut` -> dropped;
5. anything else -> accepted only with `allow_internet_access: true`.

`allow_internet_access: false` equals `denyOut: ["0.0.0.0/0"]` (E2B); omitted, it is false
here, so a sandbox that names nothing has no egress at all. Accepted packets leave the slot
through its veth with the slot address as source (SNAT); where they go from there is the
host's routing (`docs/security.md`, "Egress").
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pyroute2 import IPRoute

Net = ipaddress.IPv4Network

MAX_ENTRIES = 256  # per list: each is an nft set element, applied on every create

NEVER = tuple(Net(n) for n in (
    "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
))
SPECIAL = tuple(Net(n) for n in (
    "10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24",
    "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24",
))

_RTN_LOCAL = 2  # a route the host delivers to itself
_LOCAL_TABLE = 255


class EgressPolicyError(ValueError):
    """An allowOut/denyOut entry this node cannot enforce."""


def _parse(entries: Iterable[object], key: str) -> tuple[Net, ...]:
    nets: list[Net] = []
    for e in entries:
        if not isinstance(e, str):
            raise EgressPolicyError(f"network.{key} entries must be strings, not {e!r}")
        try:
            net = ipaddress.ip_network(e.strip(), strict=False)
        except ValueError:
            raise EgressPolicyError(
                f"network.{key}: {e!r} is not an IPv4 address or CIDR (domain names are not "
                "supported)") from None
        if not isinstance(net, Net):
            raise EgressPolicyError(f"network.{key}: {e!r} is IPv6; sandboxes have no IPv6")
        nets.append(net)
    if len(nets) > MAX_ENTRIES:
        raise EgressPolicyError(f"network.{key} holds more than {MAX_ENTRIES} entries")
    # Not collapsed here: a named private destination must stay apart from a wider entry
    # such as 0.0.0.0/0 (each set collapses on its own in compile_sets).
    return tuple(sorted(set(nets)))


@dataclass(frozen=True)
class EgressPolicy:
    """What one sandbox may reach (see the module docstring for the order)."""

    allow_out: tuple[Net, ...] = ()
    deny_out: tuple[Net, ...] = ()
    internet: bool = False  # the default for destinations neither list names

    @classmethod
    def from_request(cls, allow_internet_access: bool | None, allow_out: Sequence[object] = (),
                     deny_out: Sequence[object] = ()) -> EgressPolicy:
        """From an E2B create body; raises EgressPolicyError on entries it cannot enforce."""
        return cls(_parse(allow_out, "allowOut"), _parse(deny_out, "denyOut"),
                   internet=bool(allow_internet_access))

    @property
    def is_closed(self) -> bool:
        """Nothing is reachable: the slot's default state, nothing to apply."""
        return not self.allow_out and not self.internet

    def to_json(self) -> dict[str, object]:
        return {"allowOut": [str(n) for n in self.allow_out],
                "denyOut": [str(n) for n in self.deny_out], "internet": self.internet}

    @classmethod
    def from_json(cls, d: dict[str, object]) -> EgressPolicy:
        allow, deny = d.get("allowOut", []), d.get("denyOut", [])
        assert isinstance(allow, list) and isinstance(deny, list)
        return cls.from_request(bool(d.get("internet")), allow, deny)


@dataclass(frozen=True)
class EgressSets:
    """The policy as the slot's nft sets hold it (each collapsed: no overlapping elements)."""

    never: tuple[Net, ...]
    allow_special: tuple[Net, ...]
    allow_out: tuple[Net, ...]
    deny_out: tuple[Net, ...]
    allow_default: tuple[Net, ...]


def host_local_networks() -> list[Net]:
    """Every IPv4 destination the calling thread's namespace (the host's) delivers to
    itself: its interface addresses and local ranges, from the local routing table."""
    nets = []
    with IPRoute() as ipr:
        for r in ipr.get_routes(family=socket.AF_INET, table=_LOCAL_TABLE):
            if r["type"] == _RTN_LOCAL and r.get_attr("RTA_DST"):
                nets.append(Net(f"{r.get_attr('RTA_DST')}/{r['dst_len']}", strict=False))
    return nets


def compile_sets(policy: EgressPolicy, slot_network: str, host_local: Iterable[Net]
                 ) -> EgressSets:
    def collapsed(nets: Iterable[Net]) -> tuple[Net, ...]:
        return tuple(ipaddress.collapse_addresses(nets))  # nft rejects overlapping elements

    inside_special = [n for n in policy.allow_out if any(n.subnet_of(s) for s in SPECIAL)]
    return EgressSets(
        never=collapsed((*NEVER, Net(slot_network), *host_local)),
        allow_special=collapsed(inside_special),
        allow_out=collapsed(n for n in policy.allow_out if n not in inside_special),
        deny_out=collapsed(policy.deny_out),
        allow_default=(Net("0.0.0.0/0"),) if policy.internet else (),
    )
