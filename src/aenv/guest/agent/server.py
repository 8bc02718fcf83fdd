"""Start-up: sandbox state, user cgroup, process table, watchers, HTTP server."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket

from .app import AgentApp
from .cgroup import setup_user_cgroup
from .journal import Journal, JournalHandler
from .metrics import memory
from .options import AgentOptions
from .processes import ProcessTable
from .spawn import SpawnPolicy
from .state import SandboxState
from .watchers import WatcherRegistry

log = logging.getLogger("aenv.guest.agent")

# Longer than any client pool's idle timeout (hyper: 90 s), so the agent never closes a
# connection the SDK is about to reuse.
KEEP_ALIVE_S = 300


def listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must be IPPROTO_TCP (not 0): asyncio only sets TCP_NODELAY on accepted sockets
    # whose proto says TCP, and without it every chunked response waits ~40 ms (Nagle
    # against the client's delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(False)
    return sock


def http_impl(choice: str) -> str:
    """httptools (C parser) when available and not overridden, else h11."""
    if choice != "auto":
        return choice
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


def make_server(app: object, options: AgentOptions):  # type: ignore[no-untyped-def]
    """The uvicorn server (HTTP/1.1, no lifespan, no access log), loaded."""
    import uvicorn

    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        http=http_impl(options.http),
        ws="none",
        lifespan="off",
        interface="asgi3",
        access_log=False,
        log_config=None,
        log_level=options.log_level,
        timeout_keep_alive=KEEP_ALIVE_S,
        server_header=False,
        date_header=False,
    )
    config.load()
    return uvicorn.Server(config)


async def serve(options: AgentOptions) -> None:
    loop = asyncio.get_running_loop()
    os.umask(0o022)
    state = SandboxState(default_user=options.default_user)
    policy = SpawnPolicy()
    if options.cgroup_root:
        policy = setup_user_cgroup(
            options.cgroup_root,
            pids_max=options.pids_max,
            memory_max=options.memory_max,
            mem_total=memory()[0],
        )
    if os.access(options.exec_helper, os.X_OK):
        policy = dataclasses.replace(policy, exec_helper=options.exec_helper)
    journal = Journal()
    logging.getLogger("aenv.guest.agent").addHandler(JournalHandler(journal))
    table = ProcessTable(loop, policy, journal)
    watchers = WatcherRegistry(loop.add_reader, loop.remove_reader)
    app = AgentApp(options, state, table, watchers)
    sock = listen(options.host, options.port)
    server = make_server(app, options)
    log.info("aenv agent listening on %s:%d", options.host, options.port)
    try:
        await server.serve(sockets=[sock])
    finally:
        watchers.close_all()
        table.kill_all()


def main(options: AgentOptions) -> None:
    logging.basicConfig(
        level=options.log_level.upper(), format="aenv-agent %(levelname)s %(message)s"
    )
    asyncio.run(serve(options))
