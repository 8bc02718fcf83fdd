"""The cluster settings (`config.ClusterConfig`) from env and file, and the node's name
and URL derived from them (`cluster/node.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aenv import config
from aenv.cluster.identity import node_name, node_url


def test_a_node_is_standalone_unless_etcd_endpoints_are_set() -> None:
    cfg = config.load(env={})
    assert cfg.cluster.etcd_endpoints == [] and cfg.cluster.lease_ttl_s == 10


def test_cluster_settings_from_env_win_over_the_file(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[cluster]\netcd_endpoints = ["http://file:2379"]\nnode_name = "from-file"\n')
    cfg = config.load(f, env={"AENV_ETCD_ENDPOINTS": "http://a:2379, http://b:2379,",
                              "AENV_CLUSTER_LEASE_TTL_S": "4", "AENV_NODE_URL": "http://n:1/"})
    assert cfg.cluster.etcd_endpoints == ["http://a:2379", "http://b:2379"]
    assert cfg.cluster.node_name == "from-file" and cfg.cluster.lease_ttl_s == 4
    assert node_url(cfg) == "http://n:1" and node_name(cfg) == "from-file"


def test_defaults_name_the_host_and_instance_and_its_listen_address() -> None:
    cfg = config.load(env={"AENV_INSTANCE": "n7", "AENV_PORT": "8123"})
    assert node_name(cfg).endswith("-n7")
    assert node_url(cfg) == "http://127.0.0.1:8123"
    assert node_url(config.load(env={"AENV_PUBLIC_URL": "https://node7.example"})) == \
        "https://node7.example"


@pytest.mark.parametrize("env", [{"AENV_CLUSTER_LEASE_TTL_S": "1"},
                                 {"AENV_CLUSTER_PREFIX": "no-slashes"}])
def test_bad_cluster_settings_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(config.ConfigError, match=f"^{next(iter(env))}: "):
        config.load(env=env)
