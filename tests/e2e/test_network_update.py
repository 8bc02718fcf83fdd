"""Egress as E2B defines it, with real VMs and the unmodified SDK: public destinations open by
default and closed by `allow_internet_access=False`; `update_network` replaces the policy of
a running sandbox at once (a connection already open is reset), of a hot- and of a cold-
paused one for its resume, and forks inherit it.

"The internet" is a namespace of the test (198.19.x, tests/support/internet.py), which the
node treats as public (`AENV_NETWORK_PUBLIC_RANGES`); forwarding is on for the node's slot
veths only, so nothing leaves the machine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from tests.support import census
from tests.support.guest import held_connection
from tests.support.internet import (
    Internet,
    free_port,
    internet_with_http,
    slots_forwarding,
)

from .conftest import NodeProcess, require_base_template, sdk_pointed_at

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

BODY = b"hello from the test internet\n"


@pytest.fixture(scope="module")
def inet() -> Iterator[tuple[Internet, int]]:
    with internet_with_http(BODY) as got:
        yield got


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory,
         inet: tuple[Internet, int]) -> Iterator[NodeProcess]:  # fmt: skip
    instance = census.new_instance()
    log = Path(tmp_path_factory.mktemp("node")) / "node.log"
    n = NodeProcess(free_port(), log, extra_env={
        "AENV_INSTANCE": instance, "AENV_WARM_POOL_SIZE": "0",
        # Slots below 198.19.x (as in the isolation tests); the test internet is public here.
        "AENV_SLOT_NETWORK": "198.18.0.0/16", "AENV_NETWORK_PUBLIC_RANGES": "198.19.0.0/16",
        "AENV_HOT_PAUSE_MAX": "1"})  # fmt: skip
    n.start()
    try:
        with slots_forwarding(instance), sdk_pointed_at(n):
            require_base_template(n)
            yield n
    finally:
        code = n.stop()
        print(n.tail(60))
        census.release(instance)
    assert code == 0


def _get(sbx: Sandbox, inet: tuple[Internet, int]) -> str:
    """The internet server's answer from inside the sandbox, or how it failed."""
    net, port = inet
    r = sbx.commands.run(f"curl -s --connect-timeout 2 --max-time 4 http://{net.addr}:{port}/"
                         " || echo failed $?")  # fmt: skip
    return r.stdout


def _reachable(sbx: Sandbox, inet: tuple[Internet, int]) -> bool:
    out = _get(sbx, inet)
    # The body; or curl's 28, a timeout (dropped), or 7, no route (a slot never opened).
    assert out in (BODY.decode(), "failed 28\n", "failed 7\n"), out
    return out == BODY.decode()


def test_public_destinations_are_open_by_default_and_false_closes_them(
    node: NodeProcess, inet: tuple[Internet, int]
) -> None:
    default = Sandbox.create(timeout=120)
    closed = Sandbox.create(timeout=120, allow_internet_access=False)
    try:
        assert _reachable(default, inet)
        assert not _reachable(closed, inet)
        assert closed.get_info().allow_internet_access is False
    finally:
        default.kill()
        closed.kill()


def test_an_update_closes_a_running_sandbox_open_connections_too_and_reopens_it(
    node: NodeProcess, inet: tuple[Internet, int]
) -> None:
    sbx = Sandbox.create(timeout=180)
    try:
        # Left alone, a held connection completes; closed meanwhile, it is reset.
        net, port = inet
        assert held_connection(sbx, net.addr, port) == "got HTTP/1.0 200 OK"
        assert held_connection(sbx, net.addr, port, lambda: sbx.update_network(
            {"deny_out": [net.addr]})) == "ECONNRESET"
        assert not _reachable(sbx, inet)  # a new one is dropped
        assert sbx.get_info().network == {"allow_out": [], "deny_out": [f"{inet[0].addr}/32"],
                                          "allow_public_traffic": True}
        sbx.update_network({})  # everything back to the default: open
        assert _reachable(sbx, inet)
        sbx.update_network({"allow_internet_access": False})
        assert not _reachable(sbx, inet)
        sbx.update_network({"deny_out": ["0.0.0.0/0"], "allow_out": [inet[0].addr]})
        assert _reachable(sbx, inet)  # allow wins over deny, as in E2B
    finally:
        sbx.kill()


def test_an_update_while_paused_hot_or_cold_holds_at_resume_and_in_forks(
    node: NodeProcess, inet: tuple[Internet, int]
) -> None:
    a, b = Sandbox.create(timeout=180), Sandbox.create(timeout=180)
    kids: list[Sandbox] = []
    try:
        assert a.pause() is True
        assert b.pause() is True  # the hot budget holds one: a goes cold
        with node.api() as c:
            tiers = [c.get(f"/sandboxes/{s.sandbox_id}").json().get("pauseTier") for s in (a, b)]
        assert tiers == ["cold", "hot"]
        for s in (a, b):
            s.update_network({"allow_internet_access": False})
        a, b = Sandbox.connect(a.sandbox_id), Sandbox.connect(b.sandbox_id)
        assert not _reachable(a, inet) and not _reachable(b, inet)
        out = a.fork(count=1, timeout=120)
        assert all(isinstance(k, Sandbox) for k in out), out
        kids += out  # type: ignore[arg-type]
        assert not _reachable(kids[0], inet)  # a fork inherits its parent's policy
        kids[0].update_network({})
        assert _reachable(kids[0], inet) and not _reachable(a, inet)  # its own from then on
    finally:
        for s in (a, b, *kids):
            s.kill()
