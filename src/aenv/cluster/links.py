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

import asyncio
import functools
import logging
import ssl
import weakref
from pathlib import Path
from urllib.parse import urlsplit

from aenv.config import ClusterConfig, Config
from aenv.origins import loopback_host

log = logging.getLogger("aenv.cluster")
RELOAD_CHECK_S = 10.0  # how soon replaced certificate files are taken


class LinksRefused(Exception):
    """A link this configuration must not use, or certificates that do not load: one line."""


class Links:
    """One per set of files in a process (`of`): every context made from them is kept, so
    that new files (a rotation: docs/cluster.md) reach all of them without a restart."""

    def __init__(self, ca_file: Path, cert_file: Path, key_file: Path) -> None:
        self.ca_file, self.cert_file, self.key_file = ca_file, cert_file, key_file
        self._contexts: weakref.WeakSet[ssl.SSLContext] = weakref.WeakSet()
        self._seen = self._stamp()

    @classmethod
    def of(cls, cfg: ClusterConfig) -> Links | None:
        if cfg.ca_file is None or cfg.cert_file is None or cfg.key_file is None:
            return None
        return _links(cfg.ca_file, cfg.cert_file, cfg.key_file)

    def track(self, ctx: ssl.SSLContext) -> ssl.SSLContext:
        """Reload `ctx` with the rest (the cluster listener's, which uvicorn made)."""
        self._contexts.add(ctx)
        return ctx

    def reload(self) -> bool:
        """Load the files again into every context (a handshake from now on uses them):
        the new certificate and key, and the CA file's certificates besides those already
        trusted (the old CA stays trusted until a restart: the overlap). False, logged, if
        the new files do not load: the old ones stay."""
        try:
            self.server()  # the pair and the CA file load, or nothing changes
        except (LinksRefused, ssl.SSLError) as e:
            log.error("links.reload_failed: %s", e)
            return False
        for ctx in list(self._contexts):
            ctx.load_verify_locations(cafile=str(self.ca_file))
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        self._seen = self._stamp()
        log.info("links.reloaded: %s", self.cert_file)
        return True

    async def watch(self, every_s: float = RELOAD_CHECK_S) -> None:
        """Reload whenever a file changes (checked every `every_s`)."""
        while True:
            await asyncio.sleep(every_s)
            if self._stamp() != self._seen:
                self.reload()

    def _stamp(self) -> tuple[float, ...]:
        out = []
        for p in (self.ca_file, self.cert_file, self.key_file):
            try:
                out.append(p.stat().st_mtime)
            except OSError:
                out.append(-1.0)
        return tuple(out)

    def client(self) -> ssl.SSLContext:
        """For calls to nodes: theirs verified against the cluster's CA and the URL's host,
        ours presented."""
        ctx = ssl.create_default_context(cafile=self._path(self.ca_file))
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load(ctx)
        return self.track(ctx)

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


@functools.cache
def _links(ca_file: Path, cert_file: Path, key_file: Path) -> Links:
    return Links(ca_file, cert_file, key_file)


class TokenFile:
    """`cluster.token_file`: the cluster token kept in a file, taken again when the file
    changes. Its first line is the token this member sends, every line a token it takes
    (with `accept_tokens`). `cfg` is changed in place: every use reads it at the moment."""

    def __init__(self, cfg: ClusterConfig) -> None:
        self.cfg = cfg
        self._seen = -2.0

    def apply(self) -> bool:
        """Read the file into `cfg` if it changed; LinksRefused if it holds no token."""
        path = self.cfg.token_file
        if path is None:
            return False
        try:
            stamp = path.stat().st_mtime
            if stamp == self._seen:
                return False
            lines = [t.strip() for t in path.read_text().splitlines() if t.strip()]
        except OSError as e:
            raise LinksRefused(f"cluster.token_file {path}: {e.strerror}") from None
        if not lines:
            raise LinksRefused(f"cluster.token_file {path} holds no token")
        self.cfg.take_token_file(lines)
        self._seen = stamp
        return True

    async def watch(self, every_s: float = RELOAD_CHECK_S) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                if self.apply():
                    log.info("links.token_reloaded: %s", self.cfg.token_file)
            except LinksRefused as e:
                log.error("links.token_reload_failed: %s (the last token stays)", e)


def verify_for(cfg: ClusterConfig) -> ssl.SSLContext | bool:
    """httpx's `verify` for calls to peers: the link context, or the default."""
    links = Links.of(cfg)
    return links.client() if links is not None else True


def link_port(cfg: Config) -> int:
    return cfg.cluster.link_port or cfg.port + 1


def loopback(url: str) -> bool:
    return loopback_host(urlsplit(url).hostname or "")


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
