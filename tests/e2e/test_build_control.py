"""Template builds under the node's control, with the unmodified SDK: RUN steps reach what
the builds' egress policy opens (a test "internet" server) and nothing else; builds beyond
`max_concurrent_builds` wait; a cancelled build (aenv's DELETE) and a build whose node was
killed end `error` and leave no template and no build VM; a build context over the node's
bound is refused (413)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2b import Sandbox, Template
from e2b.template.types import BuildInfo

from tests.support import census
from tests.support.host import DATA_DIR
from tests.support.internet import (
    Internet,
    free_port,
    internet_with_http,
    slots_forwarding,
)
from tests.support.registry import Seeded, have_tools

from .conftest import NodeProcess, qemu_pids, sdk_pointed_at

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900),
              pytest.mark.skipif(have_tools() is not None, reason=have_tools() or "")]

BODY = b"hello from the test internet\n"
# busybox's own HTTP client (its wget needs glibc's resolver, which a static busybox lacks).
GET = "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5"


@pytest.fixture(scope="module")
def inet() -> Iterator[tuple[Internet, int]]:
    with internet_with_http(BODY) as got:
        yield got


def _node(tmp: Path, name: str, instance: str, inet: Internet) -> NodeProcess:
    n = NodeProcess(free_port(), tmp / f"{name}.log", extra_env={
        "AENV_INSTANCE": instance, "AENV_MAX_CONCURRENT_BUILDS": "1",
        "AENV_BUILD_CONTEXT_MAX_BYTES": str(1 << 20), "AENV_BUILD_EGRESS_ALLOW": str(inet.net),
        "AENV_WARM_POOL_SIZE": "0",
        # Slots of their own below 198.19.x, which is then no other sandbox's (as in the
        # network isolation tests); the test internet lives there.
        "AENV_SLOT_NETWORK": "198.18.0.0/16"})  # fmt: skip
    n.start()
    return n


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory,
         inet: tuple[Internet, int]) -> Iterator[NodeProcess]:
    instance = census.new_instance()
    n = _node(tmp_path_factory.mktemp("node"), "node", instance, inet[0])
    try:
        with slots_forwarding(instance), sdk_pointed_at(n):
            yield n
    finally:
        code = n.stop()
        print(n.tail(100))
        census.release(instance)
    assert code == 0


def _wait(what: str, ok: Callable[[], bool], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def _status(info: BuildInfo) -> tuple[str, list[str], str]:
    s = Template.get_build_status(info, logs_offset=0)
    reason = s.reason.message if s.reason else ""
    return s.status.value, [e.message for e in s.log_entries], reason


def test_run_steps_reach_what_the_build_policy_opens_and_nothing_else(
        node: NodeProcess, seeded: Seeded, inet: tuple[Internet, int]) -> None:
    net, port = inet
    name = f"e2e-egress-{os.urandom(3).hex()}"
    t = (Template().from_image(seeded.sibling)
         .run_cmd(f"{GET} {net.addr} {port} > /home/user/got"))  # fmt: skip
    Template.build(t, name)
    sbx = Sandbox.create(name, timeout=120)
    try:
        assert sbx.commands.run("cat /home/user/got").stdout.endswith("\r\n\r\n" + BODY.decode())
    finally:
        sbx.kill()
    # The host's other address is no part of the opened range: the step fails.
    t = Template().from_image(seeded.sibling).run_cmd(f"{GET} {net.host_public} {port}")
    with pytest.raises(Exception, match="exit code 1"):
        Template.build(t, f"{name}-closed")
    assert not Template.exists(f"{name}-closed")


def test_builds_wait_for_a_slot_and_a_cancelled_one_leaves_nothing(
        node: NodeProcess, seeded: Seeded) -> None:
    tag = os.urandom(3).hex()
    slow = Template.build_in_background(
        Template().from_image(seeded.sibling).run_cmd("sleep 600"), f"e2e-slow-{tag}")
    _wait("the slow build's step", lambda: "[1/1] RUN sleep 600" in _status(slow)[1])
    quick = Template.build_in_background(
        Template().from_image(seeded.sibling).run_cmd("echo b > /home/user/b"),
        f"e2e-quick-{tag}")  # fmt: skip
    _wait("the quick build to queue",
          lambda: any("Waiting for a free build slot" in m for m in _status(quick)[1]))
    time.sleep(1)
    assert not any(m.startswith("[1/1]") for m in _status(quick)[1])  # still waiting
    with node.api() as c:
        r = c.delete(f"/templates/{slow.template_id}/builds/{slow.build_id}")
        assert r.status_code == 204, r.text
        r = c.delete(f"/templates/{slow.template_id}/builds/{slow.build_id}")
        assert r.status_code == 409 and "not running" in r.json()["message"]
    status, _, reason = _status(slow)
    assert (status, reason) == ("error", "the build was cancelled")
    _wait("the quick build", lambda: _status(quick)[0] == "ready")
    assert Template.exists(f"e2e-quick-{tag}") and not Template.exists(f"e2e-slow-{tag}")
    assert not qemu_pids(node.env["AENV_INSTANCE"])  # no build VM is left running


def test_a_context_over_the_bound_is_refused(node: NodeProcess, seeded: Seeded,
                                            tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(os.urandom(2 << 20))  # incompressible: > 1 MiB
    t = Template(file_context_path=str(tmp_path)).from_image(seeded.sibling).copy(
        "big.bin", "/srv/big.bin")
    contexts = DATA_DIR / "images" / "contexts"
    before = set(contexts.iterdir()) if contexts.is_dir() else set()  # e.g. aenv setup's own
    with pytest.raises(Exception, match="413 Request Entity Too Large"):
        Template.build(t, f"e2e-big-{os.urandom(3).hex()}")
    assert not [p.name for p in set(contexts.iterdir()) - before if p.stat().st_size > 1 << 20]
    assert not list(contexts.glob(".tmp-*"))  # the cut-off upload left nothing


def test_a_node_killed_during_a_build_marks_it_error_and_leaks_nothing(
        seeded: Seeded, inet: tuple[Internet, int], tmp_path: Path) -> None:
    instance = census.new_instance()
    a = _node(tmp_path, "a", instance, inet[0])
    try:
        with sdk_pointed_at(a):
            info = Template.build_in_background(
                Template().from_image(seeded.sibling).run_cmd("sleep 600"),
                f"e2e-killed-{os.urandom(3).hex()}")  # fmt: skip
            _wait("the build's step", lambda: "[1/1] RUN sleep 600" in _status(info)[1])
        a.kill9()
        b = _node(tmp_path, "b", instance, inet[0])
        try:
            with sdk_pointed_at(b):
                status, _, reason = _status(info)
                assert (status, reason) == ("error", "the node restarted during the build")
                assert not Template.exists(info.template_id)
            assert not qemu_pids(instance), "the build VM outlived its node's restart"
            assert census.problems(instance) == []
        finally:
            assert b.stop() == 0, b.tail()
    finally:
        if a.proc and a.proc.poll() is None:
            a.kill9()
        census.release(instance)
