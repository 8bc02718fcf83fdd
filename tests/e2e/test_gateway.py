"""A cluster behind a load balancer (issue 14, "done when"): a real etcd, three real nodes
(each its own instance and slot range), two `aenv gateway`s and Debian's haproxy in front
of them, with the unmodified SDK pointed at the load balancer alone. The acceptance
scenario (scenarios.py) runs through it, sync, async and npm, with sandboxes on all three
nodes; then what only a cluster has: signed URLs that carry no sandbox id, a pause and
resume, and the bindings in etcd; and the scenario once more with only E2B_DOMAIN set,
over TLS."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import Sandbox, Template

from tests.support import census
from tests.support.client_ns import client_namespace
from tests.support.cluster import Child, gateway, gateway_ready, haproxy, link_env
from tests.support.etcd import EtcdCluster, secured_etcd
from tests.support.guest import until
from tests.support.registry import Seeded, have_tools
from tests.support.tls import make_certs

from .conftest import API_KEY, NodeProcess, running_node, sdk_pointed_at
from .scenarios import async_sdk_scenario, js_sdk_scenario, sync_sdk_scenario
from .test_rl import sigkilled_fleet

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

TOKEN = "e2e-cluster-token"
DOMAIN = "aenv-e2e.test"
REPO = Path(__file__).resolve().parents[2]
# Three nodes at once on one host: disjoint host-side slot ranges (4096 slots each).
SLOT_NETWORKS = ("198.19.0.0/18", "198.19.64.0/18", "198.19.128.0/18")


@dataclass
class Cluster:
    etcd: EtcdCluster
    prefix: str
    nodes: list[NodeProcess]
    gateway: Child  # the load balancer in front of the gateways: what clients call
    env: dict[str, str]  # what nodes and gateways of this cluster are given
    gateways: list[Child]  # behind the load balancer

    def binding(self, sandbox_id: str) -> dict | None:  # type: ignore[type-arg]
        key = base64.b64encode(f"{self.prefix}bindings/{sandbox_id}".encode()).decode()
        kvs = self.etcd.call("/v3/kv/range", {"key": key}).get("kvs", [])
        return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None

    def creates(self, node: NodeProcess) -> float:
        """Sandboxes this node created (its own metrics)."""
        text = httpx.get(node.origin + "/metrics", timeout=10).text
        m = re.search(r'^aenv_sandbox_ops_total\{op="create",outcome="ok"\} (\S+)$', text, re.M)
        return float(m.group(1)) if m else 0.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("cluster")
    prefix = f"/e{os.urandom(3).hex()}/"
    instances = [census.new_instance() for _ in SLOT_NETWORKS]
    # etcd as an operator runs it: TLS, client certificates, users (issue 33).
    with secured_etcd(tmp / "etcd-tls") as etcd, contextlib.ExitStack() as stack:
        for inst in instances:
            stack.callback(census.release, inst)
        common = {**etcd.aenv_env(), "AENV_CLUSTER_PREFIX": prefix,
                  "AENV_CLUSTER_TOKEN": TOKEN}  # fmt: skip
        nodes = []
        for i, (inst, net) in enumerate(zip(instances, SLOT_NETWORKS, strict=True)):
            (tmp / f"n{i}").mkdir()
            nodes.append(stack.enter_context(running_node(  # over TLS links (issue 33)
                tmp / f"n{i}", AENV_INSTANCE=inst, AENV_SLOT_NETWORK=net,
                AENV_NODE_NAME=f"n{i}", AENV_WARM_POOL_SIZE="1", **common,
                AENV_IMAGE_REGISTRIES="127.0.0.1",  # the test registry's images on demand
                **link_env(tmp, f"n{i}"))))  # fmt: skip
        common = {**common, **link_env(tmp, "gateway", node=False)}  # the gateways'
        gws = []
        for i in range(2):
            gw = gateway(tmp, f"gateway{i}", common, API_KEY)
            gw.start(gateway_ready(gw, len(nodes)))
            stack.callback(lambda g=gw: print(g.tail(100)))
            stack.callback(lambda g=gw: g.stop() == 0 or pytest.fail(f"gateway exit:\n{g.tail()}"))
            gws.append(gw)
        lb = haproxy(tmp, gws)
        lb.start()
        stack.callback(lb.stop)
        with sdk_pointed_at(lb):  # type: ignore[arg-type]
            yield Cluster(etcd, prefix, nodes, lb, common, gws)


def test_the_sync_scenario_runs_through_the_load_balancer_on_all_three_nodes(
    cluster: Cluster,
) -> None:
    before = [cluster.creates(n) for n in cluster.nodes]
    # One sandbox held through the scenario: its two sandboxes alive at once then land on
    # the two other nodes (placement spreads to the least loaded).
    ballast = Sandbox.create(timeout=300)
    try:
        sync_sdk_scenario()
    finally:
        ballast.kill()
    made = [cluster.creates(n) - b for n, b in zip(cluster.nodes, before, strict=True)]
    assert all(m >= 1 for m in made), f"creates per node: {made}"


def test_one_group_key_through_two_gateways_makes_one_group(cluster: Cluster) -> None:
    """The RL plane lives on the cluster's RL home (etcd): calls with one key through two
    gateways join one group; a member's own calls go to its node; the lease released
    through the other gateway ends the group."""
    gws = cluster.gateways
    body = {"key": "two-gateways", "source": {"template": "base"}, "lease_s": 120}

    def call(method: str, i: int, path: str, **kw: object) -> httpx.Response:
        return httpx.request(method, gws[i % 2].origin + path, timeout=300,
                             headers={"X-API-Key": API_KEY}, **kw)  # type: ignore[arg-type]

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: call("POST", i, "/rl/groups", json=body), range(4)))
    assert [r.status_code for r in got] == [201] * 4, [r.text for r in got]
    docs = [r.json() for r in got]
    assert len({d["groupID"] for d in docs}) == 1 and sum(d["created"] for d in docs) == 1
    members = [d["member"]["sandboxID"] for d in docs]
    home = cluster.etcd.call("/v3/kv/range", {
        "key": base64.b64encode(f"{cluster.prefix}rl/home".encode()).decode()})
    home_node = base64.b64decode(home["kvs"][0]["value"]).decode()
    assert {cluster.binding(m)["node"] for m in members} == {home_node}  # type: ignore[index]
    assert Sandbox.connect(members[0]).commands.run("echo member").stdout == "member\n"
    r = call("POST", 1, f"/rl/sandboxes/{members[0]}/checkpoints")
    assert r.status_code == 201, r.text
    r = call("GET", 0, f"/rl/groups/{docs[0]['groupID']}")
    assert r.status_code == 200 and r.json()["joins"] == 4
    assert call("DELETE", 1, f"/rl/leases/{docs[0]['lease']['leaseID']}").status_code == 204
    for m in members:
        assert call("GET", 0, f"/sandboxes/{m}").status_code == 404


@pytest.mark.long
def test_a_sigkilled_trainers_sixty_members_go_through_a_gateway(cluster: Cluster) -> None:
    gone = sigkilled_fleet(cluster.gateways[0].origin, cluster.nodes, 4, 15, 10)
    print(f"4 x 15 members gone {gone:.1f} s after the trainer died (lease_s 10)")
    assert gone < 10 + 5, f"4 x 15 members gone {gone:.1f} s after the trainer died"


def test_the_async_scenario_runs_through_the_load_balancer(cluster: Cluster) -> None:
    async_sdk_scenario()


def test_the_npm_sdk_runs_through_the_load_balancer(cluster: Cluster) -> None:
    js_sdk_scenario(cluster.gateway.origin, API_KEY, cluster.gateway.tail)


def test_signed_urls_pause_and_resume_and_bindings_through_the_gateway(
    cluster: Cluster,
) -> None:
    boxes = [Sandbox.create(timeout=300) for _ in range(2)]
    try:
        where = {cluster.binding(s.sandbox_id)["node"] for s in boxes}  # type: ignore[index]
        assert where == {"n0", "n1"}
        for s in boxes:
            # A signed URL names no sandbox: the gateway asks the nodes whose it is.
            up = httpx.post(s.upload_url("/tmp/up.txt"), files={"file": ("up.txt", s.sandbox_id)},
                            timeout=60)  # fmt: skip
            assert up.status_code == 200, up.text
            down = httpx.get(s.download_url("/tmp/up.txt"), timeout=60)
            assert down.status_code == 200 and down.text == s.sandbox_id
            expired = s.download_url("/tmp/up.txt", use_signature_expiration=1)
            time.sleep(1.1)
            assert httpx.get(expired, timeout=60).status_code == 401
        paused = boxes[1]
        paused.commands.run("echo kept > /home/user/k")
        assert paused.pause() is True
        assert _settles(cluster, paused.sandbox_id)
        back = Sandbox.connect(paused.sandbox_id)
        assert back.commands.run("cat /home/user/k").stdout == "kept\n"
        listed = {s.sandbox_id for s in Sandbox.list().next_items()}
        assert {s.sandbox_id for s in boxes} <= listed
    finally:
        for s in boxes:
            Sandbox.kill(s.sandbox_id)
    deadline = time.monotonic() + 10
    while any(cluster.binding(s.sandbox_id) for s in boxes):
        assert time.monotonic() < deadline, "bindings outlived their sandboxes"
        time.sleep(0.1)


@pytest.mark.skipif(have_tools() is not None, reason=have_tools() or "")
def test_an_images_creates_are_placed_where_its_template_is(cluster: Cluster,
                                                           seeded: Seeded) -> None:  # fmt: skip
    """Creates by image reference through the gateway are placed (bound, reserved) like any
    other: the first node pulls the image; nodes' records then list it (here every node's:
    this test's nodes share their image cache and templates), each later create lands on a
    node that lists it, and nothing is pulled twice. (Which node is preferred when only some
    hold it: tests/unit/cluster/test_gateway_callers.py.)"""
    ref = seeded.sibling
    made = [Sandbox.create(ref, timeout=120)]
    try:
        until(lambda: ref in _record(cluster, cluster.binding(made[0].sandbox_id)["node"])
              .get("memory_of", {}), 30)  # type: ignore[index]  # fmt: skip
        made += [Sandbox.create(ref, timeout=120) for _ in range(2)]
        for s in made:
            node = cluster.binding(s.sandbox_id)["node"]  # type: ignore[index]
            assert ref in _record(cluster, node)["memory_of"], node
        assert made[2].commands.run("cat /sibling").stdout == "own"
        pulls = sum(len(re.findall(rf"image {re.escape(ref)}: pulling ", n.log.read_text()))
                    for n in cluster.nodes)  # fmt: skip
        assert pulls == 1
    finally:
        for s in made:
            s.kill()


def _record(c: Cluster, node: str) -> dict[str, Any]:
    key = base64.b64encode(f"{c.prefix}nodes/{node}".encode()).decode()
    kvs = c.etcd.call("/v3/kv/range", {"key": key}).get("kvs", [])
    return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else {}


def test_a_template_build_through_the_load_balancer(cluster: Cluster) -> None:
    """The E2B build API (create, upload-free steps, status polling, logs) through the load
    balancer: every call of the build reaches the node that runs it, and the template it
    makes creates sandboxes through the gateways."""
    name = f"gw-build-{os.urandom(3).hex()}"
    Template.build(Template().from_template("base").run_cmd("echo via-gateway > /tmp/b.txt",
                                                            user="root"), name)  # fmt: skip
    try:
        assert Template.exists(name)
        sbx = Sandbox.create(name, timeout=120)
        try:
            assert sbx.commands.run("cat /tmp/b.txt").stdout == "via-gateway\n"
        finally:
            sbx.kill()
    finally:
        with httpx.Client(base_url=cluster.gateway.origin, headers={"X-API-Key": API_KEY},
                          timeout=60) as c:  # fmt: skip
            assert c.delete(f"/templates/{name}").status_code == 204


@contextlib.contextmanager
def tls_front(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[Any, dict[str, str]]]:
    """What a client of a production cluster has: haproxy (TLS passed through) in front of
    two gateways that terminate TLS with a wildcard certificate, reached as api.<domain>
    and <port>-<id>.<domain> through a client namespace's own resolver. Yields the namespace
    and the env a client process there gets (E2B_DOMAIN and the key, and the test CA)."""
    certs = make_certs(tmp_path / "certs", DOMAIN)
    with client_namespace(DOMAIN) as ns, contextlib.ExitStack() as stack:
        gws = []
        for i in range(2):
            gw = gateway(tmp_path, f"tls-gateway{i}", cluster.env, API_KEY,
                         AENV_DOMAIN=DOMAIN, AENV_TLS_CERT_FILE=str(certs.cert),
                         AENV_TLS_KEY_FILE=str(certs.key))  # fmt: skip
            gw.start(gateway_ready(gw, len(cluster.nodes), f"https://127.0.0.1:{gw.port}",
                                   verify=certs.by_address()))  # fmt: skip
            stack.callback(lambda g=gw: g.stop() == 0 or pytest.fail(g.tail()))
            stack.callback(lambda g=gw: print(g.tail(50)))
            gws.append(gw)
        lb = haproxy(tmp_path, gws, bind=ns.server_ip, port=443, tcp=True)
        lb.start(gateway_ready(lb, len(cluster.nodes), f"https://{ns.server_ip}",
                               verify=certs.by_address()))  # fmt: skip
        stack.callback(lb.stop)
        yield ns, {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
                   "E2B_DOMAIN": DOMAIN, "E2B_API_KEY": API_KEY,
                   "SSL_CERT_FILE": str(certs.ca)}  # fmt: skip


def test_the_sync_scenario_over_tls_with_only_e2b_domain(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The acceptance scenario as a production client runs it (tls_front)."""
    with tls_front(cluster, tmp_path) as (ns, env):
        script = "from tests.e2e.scenarios import sync_sdk_scenario; sync_sdk_scenario()"
        r = ns.run([sys.executable, "-c", script], env, timeout=600, cwd=REPO)
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"


def _settles(cluster: Cluster, sandbox_id: str) -> bool:
    """A paused sandbox's binding stops holding within the node's next round."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        b = cluster.binding(sandbox_id)
        if b is not None and b["holds"] is False:
            return True
        time.sleep(0.1)
    return False
