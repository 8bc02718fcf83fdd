"""A node's name and address in its cluster."""

from __future__ import annotations

import socket

from aenv.config import Config


def node_name(cfg: Config) -> str:
    return cfg.cluster.node_name or f"{socket.gethostname()}-{cfg.instance}"


def node_url(cfg: Config) -> str:
    if cfg.cluster.node_url:
        return cfg.cluster.node_url.rstrip("/")
    if cfg.public_url:
        return cfg.public_url.rstrip("/")
    host = socket.gethostname() if cfg.host in ("0.0.0.0", "::") else cfg.host
    return f"http://{host}:{cfg.port}"
