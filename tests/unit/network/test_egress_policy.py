"""Egress policy: parsing E2B's allowOut/denyOut and the sets the slot's rules consult.

What the rules then do with real packets is tested from real guests in
tests/integration/network/test_isolation.py.
"""

from __future__ import annotations

import ipaddress

import pytest

from aenv.network.egress import (
    SPECIAL,
    EgressPolicy,
    EgressPolicyError,
    compile_sets,
    public_ranges,
    refused_by_address,
    special_ranges,
)
from aenv.network.rules import egress_commands, slot_ruleset

Net = ipaddress.IPv4Network
HOST = [Net("192.0.2.2/32"), Net("127.0.0.0/8")]


def test_default_and_false_are_closed() -> None:
    assert EgressPolicy().is_closed
    assert EgressPolicy.from_request(None).is_closed
    assert EgressPolicy.from_request(False, deny_out=["0.0.0.0/0"]).is_closed
    assert not EgressPolicy.from_request(True).is_closed
    # allow_internet_access=false is denyOut 0.0.0.0/0: allowOut still wins over it.
    assert EgressPolicy.from_request(False, ["203.0.113.9"]).allow_out == (
        Net("203.0.113.9/32"),)


@pytest.mark.parametrize(("entry", "msg"), [
    ("exa_mple.com", "not an IPv4 address, a CIDR, a hostname"),
    ("*", "bare wildcard"),
    ("2001:db8::/32", "IPv6"),
    ("10.0.0.0/33", "not an IPv4"),
    (7, "must be strings"),
])
def test_entries_it_cannot_enforce_are_refused(entry: object, msg: str) -> None:
    with pytest.raises(EgressPolicyError, match=msg):
        EgressPolicy.from_request(None, [entry])
    with pytest.raises(EgressPolicyError, match=msg):
        EgressPolicy.from_request(None, deny_out=[entry])


def test_domains_are_refused_in_deny_out_as_in_e2b() -> None:
    with pytest.raises(EgressPolicyError, match="denyOut: 'example.com': domains are allowed"):
        EgressPolicy.from_request(True, deny_out=["example.com"])


def test_domains_open_dns_and_the_proxy_and_nothing_else() -> None:
    plain = compile_sets(EgressPolicy.from_request(False, ["198.51.100.1"]), "198.18.0.0/16",
                         HOST)  # fmt: skip
    assert (plain.dns, plain.proxied) == ((), ())
    p = EgressPolicy.from_request(False, ["Example.COM", "*.example.org"], ["0.0.0.0/0"],
                                  dns_servers=["198.51.100.53"])  # fmt: skip
    assert p.domains == ("*.example.org", "example.com") and p.allow_out == ()
    assert not p.is_closed  # a domain alone opens something: the slot must be configured
    sets = compile_sets(p, "198.18.0.0/16", HOST)
    assert sets.dns == (Net("198.51.100.53/32"),)
    assert sets.proxied == (Net("0.0.0.0/0"),)
    assert sets.allow_out == () and sets.allow_default == ()
    assert EgressPolicy.from_json(p.to_json()) == p
    assert p.to_json()["allowOut"] == ["*.example.org", "example.com"]


def test_the_hairpin_is_for_sandboxes_that_may_reach_public_destinations_or_domains() -> None:
    def pinned(p: EgressPolicy) -> tuple[set[Net], tuple[Net, ...]]:
        sets = compile_sets(p, "198.18.0.0/16", HOST, hairpin=True)
        return set(sets.hairpin), sets.proxied

    everything = (Net("0.0.0.0/0"),)
    assert pinned(EgressPolicy.from_request(True)) == (set(HOST), everything)
    assert pinned(EgressPolicy.from_request(False, ["a.test"])) == (set(HOST), everything)
    assert pinned(EgressPolicy.from_request(False, ["198.51.100.1"])) == (set(), ())
    off = compile_sets(EgressPolicy.from_request(True), "198.18.0.0/16", HOST)
    assert (off.hairpin, off.proxied) == ((), ())  # a node without a domain: none


def test_an_allowed_name_may_not_resolve_into_closed_ranges() -> None:
    p = EgressPolicy.from_request(False, ["example.com", "10.9.0.0/16"])
    sets = compile_sets(p, "198.18.0.0/16", HOST, public=[Net("198.19.0.0/16")])
    refused = {a: refused_by_address(ipaddress.IPv4Address(a), sets) for a in (
        "93.184.216.34", "127.0.0.1", "169.254.169.254", "10.1.1.1", "10.9.0.5",
        "198.18.0.1", "198.19.200.2", "192.168.1.1")}
    assert refused == {"93.184.216.34": False, "127.0.0.1": True, "169.254.169.254": True,
                       "10.1.1.1": True, "10.9.0.5": False, "198.18.0.1": True,
                       "198.19.200.2": False, "192.168.1.1": True}  # fmt: skip


def test_entries_are_normalised_and_round_trip() -> None:
    p = EgressPolicy.from_request(True, ["10.1.2.3/16", "10.1.0.0/16", " 8.8.8.8 "],
                                  ["1.1.1.1"])
    assert p.allow_out == (Net("8.8.8.8/32"), Net("10.1.0.0/16"))
    assert EgressPolicy.from_json(p.to_json()) == p


def test_never_ranges_stay_closed_and_special_ones_open_only_by_name() -> None:
    p = EgressPolicy.from_request(True, ["0.0.0.0/0", "10.9.0.0/16", "198.19.250.2",
                                         "127.0.0.1", "93.184.216.34"])
    sets = compile_sets(p, "198.18.0.0/16", HOST)
    never = sets.never
    for addr in ("127.0.0.1", "169.254.169.254", "198.18.0.6", "192.0.2.2", "224.0.0.1",
                 "255.255.255.255", "0.0.0.1"):
        assert any(ipaddress.ip_address(addr) in n for n in never), addr
    # Named private/benchmarking destinations go to allow_special (checked before the
    # special ranges are dropped); 0.0.0.0/0 does not: it is consulted after them.
    assert sets.allow_special == (Net("10.9.0.0/16"), Net("198.19.250.2/32"))
    # 0.0.0.0/0 swallows the public address and even 127.0.0.1 (an allowOut entry in a
    # never range is accepted but changes nothing: never is consulted first).
    assert sets.allow_out == (Net("0.0.0.0/0"),)
    assert sets.allow_default == (Net("0.0.0.0/0"),)


def test_rules_text() -> None:
    rules = slot_ruleset("198.18.0.2", "198.18.0.1")
    assert "ip saddr 198.18.0.1 ip daddr 198.18.0.2 meta l4proto tcp dnat" in rules
    assert "snat ip to 198.18.0.2" in rules
    sets = compile_sets(EgressPolicy.from_request(None, ["203.0.113.9"]), "198.18.0.0/15", HOST)
    cmds = egress_commands(sets)
    assert "flush set inet aenv allow_default" in cmds  # every set is replaced
    assert "add element inet aenv allow_special { 203.0.113.9/32 }" in cmds
    assert "add element inet aenv allow_default" not in cmds
    assert "add element" not in egress_commands(None)


def test_public_ranges_leave_the_special_set_and_must_lie_inside_it() -> None:
    public = public_ranges(["198.19.0.0/16", "10.9.0.0/16"])
    special = special_ranges(public)

    def inside(addr: str) -> bool:
        return any(ipaddress.ip_address(addr) in n for n in special)

    assert not inside("198.19.200.2") and not inside("10.9.1.1")
    assert inside("198.18.0.1") and inside("10.8.255.255") and inside("10.10.0.0")
    assert inside("192.168.1.1")
    sets = compile_sets(EgressPolicy.from_request(True), "198.18.0.0/16", HOST, public)
    assert sets.special == special and sets.allow_default == (Net("0.0.0.0/0"),)
    assert special_ranges() == tuple(ipaddress.collapse_addresses(SPECIAL))
    for bad, text in [("8.8.8.0/24", "not inside a special range"),
                      ("10.0.0.0/7", "not inside a special range"),
                      ("example.com", "not an IPv4")]:  # fmt: skip
        with pytest.raises(EgressPolicyError, match=text):
            public_ranges([bad])


def test_dns_servers_are_kept_and_checked() -> None:
    p = EgressPolicy.from_request(True, dns_servers=[" 1.1.1.1", "8.8.8.8"])
    assert p.dns_servers == ("1.1.1.1", "8.8.8.8")
    assert EgressPolicy.from_json(p.to_json()) == p
    assert EgressPolicy.from_request(True).dns_servers is None
    assert EgressPolicy.from_request(True, dns_servers=[]).dns_servers == ()
    for bad in (["::1"], ["1.1.1.1/32"], [1], ["9.9.9.9"] * 11):
        with pytest.raises(EgressPolicyError, match="dnsServers"):
            EgressPolicy.from_request(True, dns_servers=bad)
