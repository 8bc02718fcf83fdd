"""What a gateway needs to serve, checked before it listens: one line saying what is
missing or not allowed (GatewayConfigError)."""

from __future__ import annotations

from aenv.api.auth import api_key_path
from aenv.cluster.etcd import EtcdRefused, EtcdSecurity
from aenv.config import Config


class GatewayConfigError(Exception):
    pass


def check(config: Config) -> str:
    """The cluster's API key, once the rest is there: etcd endpoints (over a link the
    configuration allows) and the cluster token."""
    c = config.cluster
    if not c.etcd_endpoints:
        raise GatewayConfigError("a gateway needs cluster.etcd_endpoints (AENV_ETCD_ENDPOINTS)")
    if not c.token:
        raise GatewayConfigError("a gateway needs the cluster token (AENV_CLUSTER_TOKEN), "
                                 "the same as its nodes'")  # fmt: skip
    try:
        EtcdSecurity.of(c).check(c.etcd_endpoints)
    except EtcdRefused as e:
        raise GatewayConfigError(str(e)) from None
    return config.api_key or _read_key(config)


def _read_key(config: Config) -> str:
    try:
        key = api_key_path(config).read_text().strip()
    except FileNotFoundError:
        key = ""
    if not key:
        raise GatewayConfigError("a gateway needs the cluster's API key (AENV_API_KEY, or "
                                 f"{api_key_path(config)})")  # fmt: skip
    return key
