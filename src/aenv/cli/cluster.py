"""`aenv cluster status`: the nodes registered in etcd, their load and health, read from
etcd itself (the config's `cluster.etcd_endpoints`, or `--etcd`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated

import typer

from aenv.cli import output
from aenv.cli.errors import AenvTyper, CliError

app = AenvTyper(help="The cluster this node belongs to (docs/cluster.md).", no_args_is_help=True)


@app.command()
def status(
    etcd: Annotated[str | None, typer.Option(
        "--etcd", help="etcd endpoints, comma-separated [default: the config's, or "
        "AENV_ETCD_ENDPOINTS]", show_default=False)] = None,
    as_json: Annotated[bool | None, typer.Option(
        "--json/--no-json", help="JSON (default when stdout is not a terminal).",
        show_default=False)] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="TOML file (default: $AENV_CONFIG, /etc/aenv/config.toml)",
        show_default=False)] = None,
) -> None:
    """Nodes, load and health, as the cluster's etcd has them."""
    from aenv import config as aenv_config
    from aenv.cluster.etcd import Etcd, EtcdError
    from aenv.cluster.membership import Members, NodeRecord
    from aenv.cluster.placement import Reservation, reservations

    cfg = aenv_config.load(config)
    endpoints = [e.strip() for e in etcd.split(",") if e.strip()] if etcd else \
        cfg.cluster.etcd_endpoints
    if not endpoints:
        raise CliError("no etcd endpoints: pass --etcd or set cluster.etcd_endpoints")

    async def read() -> tuple[list[NodeRecord], dict[str, Reservation]]:
        client = Etcd(endpoints)
        try:
            members = Members(client, cfg.cluster.prefix)
            await members.load()
            return (sorted(members.nodes.values(), key=lambda n: n.name),
                    await reservations(client, cfg.cluster.prefix))  # fmt: skip
        finally:
            await client.aclose()

    try:
        nodes, reserved = asyncio.run(read())
    except EtcdError as e:
        raise CliError(str(e)) from None
    if output.want_json(as_json):
        output.print_json([{**n.model_dump(), "reserved": reserved.get(
            n.name, Reservation()).model_dump()} for n in nodes])
        return
    now = time.time()
    rows = [[
        n.name, n.url, "draining" if n.draining else "ready",
        f"{n.usage.sandboxes}/{n.capacity.max_sandboxes}",
        str(reserved.get(n.name, Reservation()).sandboxes),
        f"{n.usage.memory_mib + n.usage.hot_rss_mib}/{n.capacity.memory_mib}",
        str(n.usage.hot_paused), str(len(n.templates)), str(len(n.snapshots)),
        n.accelerator or "-", n.version, f"{max(now - n.updated_at, 0):.0f}s",
    ] for n in nodes]  # fmt: skip
    output.print_table(["NODE", "URL", "STATE", "SANDBOXES", "RESERVED", "MEMORY MIB", "HOT",
                        "TEMPLATES", "SNAPSHOTS", "ACCEL", "VERSION", "UPDATED"], rows)  # fmt: skip
    if not nodes:
        output.print_lines(["no nodes registered"])
