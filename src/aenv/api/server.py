"""Run a node under uvicorn with aenv's shutdown sequence.

SIGTERM/SIGINT: stop accepting connections and creates, end open data-plane streams, give
in-flight requests `shutdown_grace_s`, then (with on_shutdown = "pause") pause every running
sandbox, end every remaining VM (runtime.close) and exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from types import FrameType

import uvicorn

from aenv.api.app import Node
from aenv.api.serving import GracefulServer, listen, tls_options
from aenv.api.welcome import first_contact
from aenv.config import Config
from aenv.obs import configure_logging, log_event

log = logging.getLogger("aenv.server")


class _Server(GracefulServer):
    def __init__(self, config: uvicorn.Config, node: Node) -> None:
        super().__init__(config)
        self.node = node
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets=None) -> None:  # type: ignore[no-untyped-def]
        await super().startup(sockets)
        if not self.should_exit:  # serving: say how to reach it
            print(first_contact(self.node.config), flush=True)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            # uvicorn would "force exit" on a second SIGINT and skip the lifespan shutdown,
            # leaving VMs behind; the shutdown already under way ends them. SIGKILL still works.
            return
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.node.begin_shutdown)
        super().handle_exit(sig, frame)


def uvicorn_config(node: Node, config: Config) -> uvicorn.Config:
    return uvicorn.Config(
        node,
        host=config.host,
        port=config.port,
        lifespan="on",
        access_log=False,
        log_config=None,
        server_header=False,
        timeout_graceful_shutdown=int(config.shutdown_grace_s),
        timeout_keep_alive=30,
        h11_max_incomplete_event_size=64 * 1024,
        **tls_options(config),  # type: ignore[arg-type]
    )


def run(config: Config) -> int:
    configure_logging(config.log_level)
    try:
        sock = listen(config.host, config.port)
    except OSError as e:
        print(f"aenv server: cannot listen on {config.host}:{config.port}: {e.strerror}",
              file=sys.stderr)
        return 1
    node = Node(config)
    server = _Server(uvicorn_config(node, config), node)
    log_event(log, "server.starting", host=config.host, port=config.port,
              data_dir=str(config.data_dir), runtime=config.runtime)  # fmt: skip
    server.run(sockets=[sock])
    return 0 if server.started else 1
