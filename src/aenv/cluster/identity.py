"""A node's name and address in its cluster."""

from __future__ import annotations

import socket

from aenv.cluster.links import link_port
from aenv.config import Config


def node_name(cfg: Config) -> str:
    return cfg.cluster.node_name or f"{socket.gethostname()}-{cfg.instance}"


def node_url(cfg: Config) -> str:
    """How gateways and peers reach it: its cluster listener where the links use TLS
    (cluster/links.py)."""
    if cfg.cluster.node_url:
        return cfg.cluster.node_url.rstrip("/")
    host = socket.gethostname() if cfg.host in ("0.0.0.0", "::") else cfg.host
    if cfg.cluster.link_tls:
        return f"https://{host}:{link_port(cfg)}"
    if cfg.public_url:
        return cfg.public_url.rstrip("/")
    return f"http://{host}:{cfg.port}"
