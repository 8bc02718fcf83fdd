"""Run a node under uvicorn with aenv's shutdown sequence.

SIGTERM/SIGINT: stop accepting connections and creates, end open data-plane streams, give
in-flight requests `shutdown_grace_s`, then (with on_shutdown = "pause") pause every running
sandbox, end every remaining VM (runtime.close) and exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from types import FrameType

import uvicorn

from aenv.api.app import Node
from aenv.api.serving import ServerWithSides, Side, console_side, listen, tls_options
from aenv.api.welcome import first_contact
from aenv.cluster.identity import node_url
from aenv.cluster.links import Links, LinksRefused, TokenFile, check_plain, link_port
from aenv.config import Config
from aenv.obs import configure_logging, log_event
from aenv.origins import console_origins

log = logging.getLogger("aenv.server")


class _Server(ServerWithSides):
    def __init__(self, config: uvicorn.Config, node: Node,
                 link: tuple[Links, uvicorn.Config, socket.socket] | None = None,
                 console: Side | None = None) -> None:
        super().__init__(config)
        self.node = node
        self._loop: asyncio.AbstractEventLoop | None = None
        self._link = link
        self._console = console
        self._watch: asyncio.Task[None] | None = None

    async def serve(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        await super().startup(sockets)
        if not self.should_exit and self._link is not None:
            links, config, sock = self._link
            config.load()
            assert config.ssl is not None
            links.track(config.ssl)  # replaced certificate files reach it (rotation)
            self.start_side(config, sock)
            self._watch = asyncio.create_task(links.watch())
        if not self.should_exit and self._console is not None:
            self.start_side(*self._console)
        if not self.should_exit:  # serving: say how to reach it
            console = console_origins(self.node.config)[0] if self._console else None
            print(first_contact(self.node.config, console), flush=True)

    async def shutdown(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        if self._watch is not None:
            self._watch.cancel()
        await super().shutdown(sockets)  # the cluster's calls and the console stop first

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            # uvicorn would "force exit" on a second SIGINT and skip the lifespan shutdown,
            # leaving VMs behind; the shutdown already under way ends them. SIGKILL still works.
            return
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.node.begin_shutdown)
        super().handle_exit(sig, frame)


def uvicorn_config(node: Node, config: Config, *, link: Links | None = None
                   ) -> uvicorn.Config:  # fmt: skip
    """The public listener's, or (`link`) the cluster listener's."""
    tls = tls_options(config) if link is None else link.uvicorn_options()
    return uvicorn.Config(
        node,
        host=config.host,
        port=config.port if link is None else link_port(config),
        lifespan="on" if link is None else "off",
        access_log=False,
        log_config=None,
        server_header=False,
        timeout_graceful_shutdown=int(config.shutdown_grace_s),
        timeout_keep_alive=30,
        h11_max_incomplete_event_size=64 * 1024,
        **tls,  # type: ignore[arg-type]
    )


def run(config: Config) -> int:
    configure_logging(config.log_level)
    try:
        sock = listen(config.host, config.port)
    except OSError as e:
        print(f"aenv server: cannot listen on {config.host}:{config.port}: {e.strerror}",
              file=sys.stderr)
        return 1
    try:
        link = _link_listener(config)
    except (LinksRefused, OSError) as e:
        sock.close()
        why = e.strerror if isinstance(e, OSError) else str(e)
        print(f"aenv server: {why}", file=sys.stderr)
        return 1
    node = Node(config)
    server = _Server(uvicorn_config(node, config), node,
                     None if link is None else (link[0], uvicorn_config(node, config,
                                                                        link=link[0]), link[1]),
                     console_side(config, config.port))
    log_event(log, "server.starting", host=config.host, port=config.port,
              data_dir=str(config.data_dir), runtime=config.runtime)  # fmt: skip
    server.run(sockets=[sock])
    return 0 if server.started else 1


def _link_listener(config: Config) -> tuple[Links, socket.socket] | None:
    """The cluster listener's certificates and socket, if the links use TLS; else the plain
    link checked (cluster/links.py). LinksRefused, OSError (a taken port)."""
    if not config.cluster.etcd_endpoints:
        return None
    TokenFile(config.cluster).apply()  # a token file that holds no token: refused here
    links = Links.of(config.cluster)
    if links is None:
        check_plain(config.cluster, node_url(config), "this node's cluster URL")
        return None
    links.uvicorn_options()
    port = link_port(config)
    try:
        return links, listen(config.host, port)
    except OSError as e:
        raise OSError(e.errno, f"cannot listen on {config.host}:{port} (cluster.link_port): "
                               f"{e.strerror}") from None
