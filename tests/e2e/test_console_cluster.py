"""The console of a cluster's gateway (`make test-long`): two real nodes, a real etcd and an
`aenv gateway` serving the console; in a real Chromium the nodes page lists both nodes, and a
drain from the page stops placements there (creates through the gateway with the SDK all go
to the other node), then an undrain takes them again. The overview is the cluster's."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from e2b import Sandbox
from playwright.sync_api import Page, expect

from tests.support import census
from tests.support.browser import (  # noqa: F401 (the fixtures browser and page)
    browser_fixture,
    log_in,
    page_fixture,
    screenshot,
)
from tests.support.cluster import Child, gateway, gateway_ready, link_env
from tests.support.etcd import etcd_cluster

from .conftest import API_KEY, NodeProcess, free_port, running_node, sdk_pointed_at

pytestmark = [pytest.mark.long, pytest.mark.timeout(900)]

SLOT_NETWORKS = ("198.19.0.0/18", "198.19.64.0/18")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[list[NodeProcess], Child, str]]:  # fmt: skip
    tmp = tmp_path_factory.mktemp("console-cluster")
    instances = [census.new_instance() for _ in SLOT_NETWORKS]
    with etcd_cluster() as etcd, contextlib.ExitStack() as stack:
        for inst in instances:
            stack.callback(census.release, inst)
        common = {"AENV_ETCD_ENDPOINTS": ",".join(etcd.endpoints),
                  "AENV_CLUSTER_PREFIX": f"/c{os.urandom(3).hex()}/",
                  "AENV_CLUSTER_TOKEN": "console-cluster-token"}  # fmt: skip
        for i in range(len(instances)):
            (tmp / f"n{i}").mkdir()
        nodes = [stack.enter_context(running_node(
            tmp / f"n{i}", AENV_INSTANCE=inst, AENV_SLOT_NETWORK=net, AENV_NODE_NAME=f"n{i}",
            AENV_OVERVIEW_SAMPLE_S="2", **common, **link_env(tmp, f"n{i}")))
            for i, (inst, net) in enumerate(zip(instances, SLOT_NETWORKS, strict=True))]
        console = free_port()
        gw = gateway(tmp, "gateway", {**common, **link_env(tmp, "gateway", node=False)},
                     API_KEY, AENV_CONSOLE_PORT=str(console))  # fmt: skip
        gw.start(gateway_ready(gw, len(nodes)))
        stack.callback(lambda: gw.stop() == 0 or pytest.fail(f"gateway exit:\n{gw.tail()}"))
        with sdk_pointed_at(gw):  # type: ignore[arg-type]
            yield nodes, gw, f"http://127.0.0.1:{console}"


def _on(node: NodeProcess, sandbox_id: str) -> bool:
    with node.api() as c:
        return c.get(f"/sandboxes/{sandbox_id}").status_code == 200


def test_the_nodes_page_lists_both_and_a_drain_from_it_stops_placements(
        cluster: tuple[list[NodeProcess], Child, str], page: Page) -> None:  # fmt: skip
    nodes, _, console = cluster
    made: list[Sandbox] = []
    try:
        log_in(page, console, API_KEY)
        page.click("#nav >> text=Nodes")
        for name in ("n0", "n1"):
            expect(page.locator(f'tr[data-node="{name}"] td.health')).to_have_text("reachable")
        screenshot(page, "nodes")
        page.click('button[aria-label="Drain n1"]')
        page.click("#confirm-ok")
        expect(page.locator("#notice")).to_have_text("n1 is draining.")
        state = page.locator('tr[data-node="n1"] td.state')
        expect(state).to_have_text("draining", timeout=30_000)
        made = [Sandbox.create("base", timeout=120) for _ in range(3)]
        assert all(_on(nodes[0], s.sandbox_id) for s in made)  # none on the drained node
        page.click('button[aria-label="Undrain n1"]')
        page.click("#confirm-ok")
        expect(state).to_have_text("ready", timeout=30_000)
        made.append(Sandbox.create("base", timeout=120))
        assert _on(nodes[1], made[-1].sandbox_id)  # the least loaded takes it again
        page.click("#nav >> text=Overview")
        expect(page.locator("#c-running")).to_contain_text("4", timeout=30_000)
        expect(page.locator("#c-node")).to_contain_text("4 of ")
        screenshot(page, "overview-cluster")
    finally:
        for s in made:
            with contextlib.suppress(Exception):
                s.kill()
