"""Run a gateway under uvicorn: `aenv gateway`. SIGTERM/SIGINT end it after open requests
finish (`shutdown_grace_s`); it holds nothing else, so a kill -9 loses only its open
streams."""

from __future__ import annotations

import logging
import sys

import uvicorn

from aenv.api.console_cors import ConsoleCors
from aenv.api.serving import ServerWithSides, console_side, listen, tls_options
from aenv.cluster.gateway.app import Gateway
from aenv.cluster.gateway.settings import GatewayConfigError
from aenv.cluster.links import LinksRefused
from aenv.config import Config
from aenv.obs import configure_logging, log_event
from aenv.origins import console_origins

log = logging.getLogger("aenv.gateway")


def run(config: Config, port: int | None = None) -> int:
    configure_logging(config.log_level)
    port = port or config.cluster.gateway_port
    try:
        sock = listen(config.host, port)
    except OSError as e:
        print(f"aenv gateway: cannot listen on {config.host}:{port}: {e.strerror}",
              file=sys.stderr)  # fmt: skip
        return 1
    try:
        gateway = Gateway(config)  # its links' certificates load here
        gateway.check_config()
    except (GatewayConfigError, LinksRefused) as e:
        sock.close()
        print(f"aenv gateway: {e}", file=sys.stderr)
        return 1
    console = console_side(config, port)  # the cluster's console (docs/console.md)
    if console is not None:
        gateway.cors = ConsoleCors(console_origins(config, port))
    server = ServerWithSides(uvicorn.Config(
        gateway, host=config.host, port=port, lifespan="on", access_log=False,
        log_config=None, server_header=False,
        timeout_graceful_shutdown=int(config.shutdown_grace_s), timeout_keep_alive=30,
        h11_max_incomplete_event_size=64 * 1024, **tls_options(config),  # type: ignore[arg-type]
    ), [console] if console is not None else [])  # fmt: skip
    log_event(log, "gateway.starting", host=config.host, port=port,
              etcd=",".join(config.cluster.etcd_endpoints),
              console=console_origins(config, port)[0] if console else None)  # fmt: skip
    server.run(sockets=[sock])
    return 0 if server.started else 1
