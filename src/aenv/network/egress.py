"""Per-sandbox egress policy: which destinations a guest may start connections to.

A create may name some with E2B's `network.allowOut` (IPv4 addresses, CIDRs and domain
names, `domains.py`) / `network.denyOut` (addresses and CIDRs) and
`allow_internet_access`; `PUT /sandboxes/{id}/network` replaces them on a
live sandbox. Every packet the guest sends, not only a connection's first, is judged in
this order, so a rule that closes a destination also stops connections already open to it:

1. **never**: loopback, "this network", link-local (169.254/16: metadata services),
   multicast, reserved and broadcast, the node's slot network (other sandboxes and the
   host's end of every slot) and every address the host delivers locally (its interfaces,
   so the API port too) -> dropped, whatever the request says;
2. **special** ranges that are never the public internet (RFC 1918 private, 100.64/10
   shared, 192.0.0/24, the documentation nets, the rest of 198.18/15) -> dropped unless an
   `allowOut` entry lies inside one (a destination named on purpose): a wider entry such
   as 0.0.0.0/0 does not open them. A node's `network.public_ranges` takes ranges out of
   this list (a lab's or a test's simulated internet);
3. `allowOut` -> accepted (allow wins over deny, as in E2B);
4. `denyOut` -> dropped;
5. anything else (public destinations) -> accepted unless `allow_internet_access` is false.

A domain in `allowOut` opens TCP 80 and 443 by name: what the order above would refuse on
those ports goes to the node's egress proxy (`egress_proxy.py`), which lets a connection
through only if its TLS SNI or HTTP Host matches an allowed domain, and then connects to
what that name resolves to (never to the address the guest chose), checked against steps 1
and 2 again. The policy's `dnsServers` (8.8.8.8 unless given) are then open on port 53.

As in E2B, public destinations are open by default; `allow_internet_access: false` equals
`denyOut: ["0.0.0.0/0"]`. A node with `network.internet_by_default = false` closes them
for sandboxes that do not ask. Accepted packets leave the slot through its veth with the
slot address as source (SNAT); where they go from there is the host's routing
(`docs/security.md`, "Egress").
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from pyroute2 import IPRoute

from aenv.network.domains import DomainError, parse_pattern
from aenv.network.socks import SocksConfigError, SocksProxy
from aenv.network.socks import resolve as resolve_proxy
from aenv.network.transforms import Rule, TransformError, parse_rules
from aenv.network.transforms import to_json as rules_to_json

Net = ipaddress.IPv4Network

MAX_ENTRIES = 256  # per list: each is an nft set element, applied on every create
MAX_DNS_SERVERS = 10  # E2B's bound
DEFAULT_DNS = ("8.8.8.8",)  # E2B's, opened when allowOut holds a domain
ALL = Net("0.0.0.0/0")

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


def _net(text: str, what: str) -> Net:
    net = _maybe_net(text, what)
    if net is None:
        raise EgressPolicyError(f"{what}: {text!r} is not an IPv4 address or CIDR")
    return net


def _maybe_net(text: str, what: str) -> Net | None:
    try:
        net = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        return None
    if not isinstance(net, Net):
        raise EgressPolicyError(f"{what}: {text!r} is IPv6; sandboxes have no IPv6")
    return net


def _parse(entries: Iterable[object], key: str) -> tuple[tuple[Net, ...], tuple[str, ...]]:
    """(addresses and CIDRs, domain patterns) of one list."""
    nets: list[Net] = []
    domains: list[str] = []
    for e in entries:
        if not isinstance(e, str):
            raise EgressPolicyError(f"network.{key} entries must be strings, not {e!r}")
        net = _maybe_net(e, f"network.{key}")
        if net is not None:
            nets.append(net)
            continue
        try:
            domains.append(parse_pattern(e))
        except DomainError as err:
            raise EgressPolicyError(f"network.{key}: {err}") from None
        if key == "denyOut":
            raise EgressPolicyError(f"network.denyOut: {e!r}: domains are allowed in allowOut "
                                    "only (as in E2B); deny by CIDR")
    if len(nets) + len(domains) > MAX_ENTRIES:
        raise EgressPolicyError(f"network.{key} holds more than {MAX_ENTRIES} entries")
    # Not collapsed here: a named private destination must stay apart from a wider entry
    # such as 0.0.0.0/0 (each set collapses on its own in compile_sets).
    return tuple(sorted(set(nets))), tuple(sorted(set(domains)))


@dataclass(frozen=True)
class EgressPolicy:
    """What one sandbox may reach (see the module docstring for the order)."""

    allow_out: tuple[Net, ...] = ()
    deny_out: tuple[Net, ...] = ()
    internet: bool = False  # public destinations neither list names
    # E2B's dnsServers: opened (port 53) only while allowOut holds a domain, and what the
    # egress proxy resolves those domains with. None: E2B's default (8.8.8.8).
    dns_servers: tuple[str, ...] | None = None
    domains: tuple[str, ...] = ()  # allowOut's domain patterns (domains.py)
    # E2B's egressProxy: what the order accepts over TCP is tunnelled through it (socks.py).
    egress_proxy: SocksProxy | None = None
    # E2B's network.rules: HTTP(S) to these domains is intercepted and rewritten.
    rules: tuple[Rule, ...] = ()

    def owned_by(self, team_id: str) -> EgressPolicy:
        """The policy as the runtime applies it for a sandbox of `team_id`: its rules'
        placeholders name that team's secrets."""
        if not self.rules:
            return self
        return replace(self, rules=tuple(replace(r, owner=team_id) for r in self.rules))

    @classmethod
    def from_request(cls, internet: bool, allow_out: Sequence[object] = (),
                     deny_out: Sequence[object] = (), dns_servers: Sequence[object] | None = None,
                     egress_proxy: object | None = None, rules: object | None = None
                     ) -> EgressPolicy:  # fmt: skip
        """From an E2B create or update body, `internet` resolved against the node's default;
        raises EgressPolicyError on entries it cannot enforce."""
        allow, domains = _parse(allow_out, "allowOut")
        deny, _ = _parse(deny_out, "denyOut")
        try:
            proxy = None if egress_proxy is None else SocksProxy.from_request(egress_proxy)
            parsed = parse_rules(rules)
        except (SocksConfigError, TransformError) as e:
            raise EgressPolicyError(str(e)) from None
        return cls(allow, deny, internet=bool(internet), dns_servers=_dns(dns_servers),
                   domains=domains, egress_proxy=proxy, rules=parsed)

    @property
    def is_closed(self) -> bool:
        """Nothing is reachable: the slot's default state, nothing to apply."""
        return not self.allow_out and not self.internet and not self.domains

    @property
    def resolvers(self) -> tuple[str, ...]:
        """The DNS servers that serve the domains (E2B's default unless named)."""
        return DEFAULT_DNS if self.dns_servers is None else self.dns_servers

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"allowOut": [*map(str, self.allow_out), *self.domains],
                                "denyOut": [str(n) for n in self.deny_out],
                                "internet": self.internet}  # fmt: skip
        if self.dns_servers is not None:
            d["dnsServers"] = list(self.dns_servers)
        if self.egress_proxy is not None:
            d["egressProxy"] = self.egress_proxy.to_json()
        if self.rules:
            d["rules"] = rules_to_json(self.rules)
        return d

    @classmethod
    def from_json(cls, d: dict[str, object]) -> EgressPolicy:
        allow, deny, dns = d.get("allowOut", []), d.get("denyOut", []), d.get("dnsServers")
        assert isinstance(allow, list) and isinstance(deny, list)
        assert dns is None or isinstance(dns, list)
        return cls.from_request(bool(d.get("internet")), allow, deny, dns, d.get("egressProxy"),
                                d.get("rules"))


def _dns(entries: Sequence[object] | None) -> tuple[str, ...] | None:
    if entries is None:
        return None
    if len(entries) > MAX_DNS_SERVERS:
        raise EgressPolicyError(f"network.dnsServers holds more than {MAX_DNS_SERVERS} entries")
    out = []
    for e in entries:
        try:
            if not isinstance(e, str):
                raise TypeError(e)
            out.append(str(ipaddress.IPv4Address(e.strip())))
        except (ValueError, TypeError):
            raise EgressPolicyError(
                f"network.dnsServers: {e!r} is not an IPv4 address") from None
    return tuple(out)


def public_ranges(entries: Iterable[str]) -> tuple[Net, ...]:
    """A node's `network.public_ranges`: each must lie inside a special range (the only
    ones it changes); raises EgressPolicyError."""
    nets = tuple(_net(e, "network.public_ranges") for e in entries)
    for n in nets:
        if not any(n.subnet_of(s) for s in SPECIAL):
            raise EgressPolicyError(f"network.public_ranges: {n} is not inside a special "
                                    f"range ({', '.join(map(str, SPECIAL))})")
    return nets


def special_ranges(public: Iterable[Net] = ()) -> tuple[Net, ...]:
    """SPECIAL without the node's public ranges."""
    out = list(SPECIAL)
    for p in public:
        out = [part for s in out for part in
               ((s,) if not s.overlaps(p) else () if s.subnet_of(p) else s.address_exclude(p))]
    return tuple(ipaddress.collapse_addresses(out))


@dataclass(frozen=True)
class EgressSets:
    """The policy as the slot's nft sets hold it (each collapsed: no overlapping elements)."""

    never: tuple[Net, ...]
    allow_special: tuple[Net, ...]
    special: tuple[Net, ...]
    allow_out: tuple[Net, ...]
    deny_out: tuple[Net, ...]
    allow_default: tuple[Net, ...]
    dns: tuple[Net, ...] = ()  # open on port 53 (the resolvers, while domains are allowed)
    proxied: tuple[Net, ...] = ()  # 0.0.0.0/0 while domains are allowed: TCP 80/443 the
    # order above refuses goes to the egress proxy instead
    resolver: str = ""  # where the guest's DNS queries to its gateway go (judged as usual)
    hairpin: tuple[Net, ...] = ()  # the host's own addresses, whose TCP 80/443 goes to the
    # egress proxy for the node's sandbox URLs (else "never")
    tunnelled: bool = False  # egressProxy: accepted TCP goes to the slot's listener
    intercepted: bool = False  # rules: TCP 80/443 goes to the slot's listener


def host_local_networks() -> list[Net]:
    """Every IPv4 destination the calling thread's namespace (the host's) delivers to
    itself: its interface addresses and local ranges, from the local routing table."""
    nets = []
    with IPRoute() as ipr:
        for r in ipr.get_routes(family=socket.AF_INET, table=_LOCAL_TABLE):
            if r["type"] == _RTN_LOCAL and r.get_attr("RTA_DST"):
                nets.append(Net(f"{r.get_attr('RTA_DST')}/{r['dst_len']}", strict=False))
    return nets


def compile_sets(policy: EgressPolicy, slot_network: str, host_local: Iterable[Net],
                 public: Iterable[Net] = (), *, hairpin: bool = False) -> EgressSets:  # fmt: skip
    """`hairpin`: the node serves sandbox URLs on a domain (egress_proxy.Hairpin); a
    sandbox that may reach public destinations or domains may reach those URLs too."""
    host_local = tuple(host_local)
    pin = hairpin and (policy.internet or bool(policy.domains))
    def collapsed(nets: Iterable[Net]) -> tuple[Net, ...]:
        return tuple(ipaddress.collapse_addresses(nets))  # nft rejects overlapping elements

    # Named inside a special range, public or not: accepted before the special drop.
    inside_special = [n for n in policy.allow_out if any(n.subnet_of(s) for s in SPECIAL)]
    return EgressSets(
        never=collapsed((*NEVER, Net(slot_network), *host_local)),
        allow_special=collapsed(inside_special),
        special=special_ranges(public),
        allow_out=collapsed(n for n in policy.allow_out if n not in inside_special),
        deny_out=collapsed(policy.deny_out),
        allow_default=(ALL,) if policy.internet else (),
        dns=collapsed(Net(a) for a in policy.resolvers) if policy.domains else (),
        proxied=(ALL,) if policy.domains or pin else (),
        hairpin=collapsed(host_local) if pin else (),
        resolver=policy.resolvers[0] if policy.resolvers else "",
        tunnelled=policy.egress_proxy is not None,
        intercepted=bool(policy.rules),
    )


def refused_by_address(addr: ipaddress.IPv4Address, sets: EgressSets) -> bool:
    """Steps 1 and 2 of the order for an address an allowed domain resolved to: never, or
    special and not named."""
    def within(nets: tuple[Net, ...]) -> bool:
        return any(addr in n for n in nets)

    return within(sets.never) or (within(sets.special) and not within(sets.allow_special))


async def check_egress_proxy(policy: EgressPolicy, public: Iterable[Net] = ()) -> None:
    """A create's or update's egressProxy must resolve outside the never and special
    ranges (E2B refuses proxies inside its infrastructure); raises EgressPolicyError."""
    if policy.egress_proxy is None:
        return
    local = await asyncio.to_thread(host_local_networks)
    try:
        await resolve_proxy(policy.egress_proxy, (*NEVER, *local, *special_ranges(public)))
    except SocksConfigError as e:
        raise EgressPolicyError(str(e)) from None


def accepted_by_address(addr: ipaddress.IPv4Address, sets: EgressSets) -> bool:
    """The whole order for one destination, as the slot's guest_egress chain judges it."""
    def within(nets: tuple[Net, ...]) -> bool:
        return any(addr in n for n in nets)

    if refused_by_address(addr, sets):
        return False
    return within(sets.allow_special) or within(sets.allow_out) or (
        not within(sets.deny_out) and within(sets.allow_default))
