"""The links between a cluster's parts: gateways to nodes, and nodes to each other
(docs/cluster.md, "Links").

With `cluster.ca_file`, `cert_file` and `key_file` (one certificate per node and gateway,
signed by the cluster's CA: `aenv cluster ca`):

- a node serves a second listener, its **cluster listener**, on `link_port` (0: `port` + 1),
  over HTTPS that asks every caller for a certificate the cluster's CA signed; its URL in
  the cluster (`node_url`'s default) is `https://<host>:<link_port>`;
- gateways and peers call it with their own certificate and verify the node's against the
  CA and the URL's host;
- the node takes the cluster token only over that listener (api/cluster_caller.py): a
  leaked token alone does not let anyone in.

Without them the links are plain HTTP, which only a node reached on this host may use,
unless `insecure_links` says otherwise (logged at every start).
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from aenv.config import ClusterConfig, Config

log = logging.getLogger("aenv.cluster")


class LinksRefused(Exception):
    """A link this configuration must not use, or certificates that do not load: one line."""


@dataclass(frozen=True)
class Links:
    ca_file: Path
    cert_file: Path
    key_file: Path

    @classmethod
    def of(cls, cfg: ClusterConfig) -> Links | None:
        if cfg.ca_file is None or cfg.cert_file is None or cfg.key_file is None:
            return None
        return cls(cfg.ca_file, cfg.cert_file, cfg.key_file)

    def client(self) -> ssl.SSLContext:
        """For calls to nodes: theirs verified against the cluster's CA and the URL's host,
        ours presented."""
        ctx = ssl.create_default_context(cafile=self._path(self.ca_file))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load(ctx)
        return ctx

    def server(self) -> ssl.SSLContext:
        """The cluster listener's: every caller shows a certificate of the cluster's CA."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cafile=self._path(self.ca_file))
        self._load(ctx)
        return ctx

    def uvicorn_options(self) -> dict[str, object]:
        self.server()  # refused here, in one line, rather than inside uvicorn
        return {"ssl_certfile": str(self.cert_file), "ssl_keyfile": str(self.key_file),
                "ssl_ca_certs": str(self.ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}

    def _load(self, ctx: ssl.SSLContext) -> None:
        try:
            ctx.load_cert_chain(self._path(self.cert_file), self._path(self.key_file))
        except ssl.SSLError as e:
            raise LinksRefused(f"cluster.cert_file {self.cert_file} and key_file "
                               f"{self.key_file} do not load as a pair: {e.reason}") from None

    @staticmethod
    def _path(p: Path) -> str:
        if not p.is_file():
            raise LinksRefused(f"{p} (a cluster certificate setting) is not a readable file")
        return str(p)


def verify_for(cfg: ClusterConfig) -> ssl.SSLContext | bool:
    """httpx's `verify` for calls to peers: the link context, or the default."""
    links = Links.of(cfg)
    return links.client() if links is not None else True


def link_port(cfg: Config) -> int:
    return cfg.cluster.link_port or cfg.port + 1


def loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_plain(cfg: ClusterConfig, url: str, what: str) -> None:
    """A plain-HTTP link to `url`: refused off this host unless insecure_links (then logged)."""
    if urlsplit(url).scheme != "http" or loopback(url):
        return
    if not cfg.insecure_links:
        raise LinksRefused(
            f"{what} {url} is plain HTTP off this host: give cluster.ca_file, cert_file and "
            "key_file (aenv cluster ca), or set cluster.insecure_links")
    log.warning("%s %s is plain HTTP off this host (cluster.insecure_links): requests, API "
                "keys and the cluster token cross the network in the clear", what, url)
