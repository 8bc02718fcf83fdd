"""`aenv cluster status`: the nodes registered in etcd, their load and health; `aenv node
drain|undrain NAME`. All read and write etcd itself (the config's `cluster.etcd_endpoints`,
or `--etcd`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from aenv.cli import output
from aenv.cli.errors import AenvTyper, CliError

if TYPE_CHECKING:
    from aenv.cluster.etcd import Etcd
    from aenv.config import Config

app = AenvTyper(help="The cluster this node belongs to (docs/cluster.md).", no_args_is_help=True)
node_app = AenvTyper(help="One node of the cluster (docs/cluster.md).", no_args_is_help=True)
T = TypeVar("T")

EtcdOpt = Annotated[str | None, typer.Option(
    "--etcd", help="etcd endpoints, comma-separated [default: the config's, or "
    "AENV_ETCD_ENDPOINTS]", show_default=False)]  # fmt: skip
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", help="TOML file (default: $AENV_CONFIG, /etc/aenv/config.toml)",
    show_default=False)]  # fmt: skip


def _with_etcd(etcd: str | None, config: Path | None,
               fn: Callable[[Etcd, Config], Awaitable[T]]) -> T:  # fmt: skip
    """Run `fn` with a client of the cluster's etcd; one line and exit 1 if unreachable."""
    from aenv import config as aenv_config
    from aenv.cluster.etcd import Etcd, EtcdError, EtcdSecurity

    cfg = aenv_config.load(config)
    endpoints = [e.strip() for e in etcd.split(",") if e.strip()] if etcd else \
        cfg.cluster.etcd_endpoints
    if not endpoints:
        raise CliError("no etcd endpoints: pass --etcd or set cluster.etcd_endpoints")

    async def run() -> T:
        client = Etcd(endpoints, security=EtcdSecurity.of(cfg.cluster))
        try:
            return await fn(client, cfg)
        finally:
            await client.aclose()

    try:
        return asyncio.run(run())
    except EtcdError as e:
        raise CliError(str(e)) from None


@app.command()
def status(
    etcd: EtcdOpt = None,
    as_json: Annotated[bool | None, typer.Option(
        "--json/--no-json", help="JSON (default when stdout is not a terminal).",
        show_default=False)] = None,
    config: ConfigOpt = None,
) -> None:
    """Nodes, load and health, as the cluster's etcd has them."""
    from aenv.cluster.membership import Members, NodeRecord
    from aenv.cluster.placement import Reservation, reservations

    async def read(client: Etcd, cfg: Config) -> tuple[list[NodeRecord], dict[str, Reservation]]:
        members = Members(client, cfg.cluster.prefix)
        await members.load()
        return (sorted(members.nodes.values(), key=lambda n: n.name),
                await reservations(client, cfg.cluster.prefix))  # fmt: skip

    nodes, reserved = _with_etcd(etcd, config, read)
    if output.want_json(as_json):
        output.print_json([{**n.model_dump(), "reserved": reserved.get(
            n.name, Reservation()).model_dump()} for n in nodes])
        return
    now = time.time()
    rows = [[
        n.name, n.url, "draining" if n.draining else "ready",
        f"{n.usage.sandboxes}/{n.capacity.max_sandboxes}",
        str(reserved.get(n.name, Reservation()).sandboxes),
        f"{n.usage.memory_mib}/{n.capacity.memory_mib}",
        f"{n.usage.held_mib}/{n.capacity.budget_mib or n.capacity.memory_mib}",
        str(n.usage.hot_paused), str(len(n.templates)), str(len(n.snapshots)),
        n.accelerator or "-", n.version, f"{max(now - n.updated_at, 0):.0f}s",
    ] for n in nodes]  # fmt: skip
    output.print_table(["NODE", "URL", "STATE", "SANDBOXES", "RESERVED", "NOMINAL MIB",
                        "HELD MIB", "HOT", "TEMPLATES", "SNAPSHOTS", "ACCEL", "VERSION",
                        "UPDATED"], rows)  # fmt: skip
    if not nodes:
        output.print_lines(["no nodes registered"])


@node_app.command()
def drain(
    name: Annotated[str, typer.Argument(help="the node's name (aenv cluster status)")],
    pause: Annotated[bool, typer.Option(
        "--pause", help="pause its running sandboxes too, rather than let them finish")] = False,
    etcd: EtcdOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Stop placements and creates on a node; its sandboxes finish (or, --pause, pause)."""
    from aenv.cluster import draining

    async def write(client: Etcd, cfg: Config) -> bool:
        return await draining.drain(client, cfg.cluster.prefix, name, pause)

    if not _with_etcd(etcd, config, write):
        raise CliError(f"no node {name!r} is registered (aenv cluster status lists them)")
    output.print_lines([f"node {name} draining" + (", its sandboxes pausing" if pause else "")])


@node_app.command()
def undrain(
    name: Annotated[str, typer.Argument(help="the node's name")],
    etcd: EtcdOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Take placements and creates on a drained node again."""
    from aenv.cluster import draining

    async def delete(client: Etcd, cfg: Config) -> bool:
        return await draining.undrain(client, cfg.cluster.prefix, name)

    if not _with_etcd(etcd, config, delete):
        raise CliError(f"node {name!r} is not draining")
    output.print_lines([f"node {name} takes sandboxes again"])


ca_app = AenvTyper(help="The cluster's CA for the links between its parts (docs/cluster.md, "
                        "\"Links\").", no_args_is_help=True)  # fmt: skip
app.add_typer(ca_app, name="ca")


@ca_app.command("init")
def ca_init(
    directory: Annotated[Path, typer.Argument(help="where ca.pem and ca.key go")],
) -> None:
    """Make the cluster's CA (EC P-256, 10 years). Keep ca.key off the members."""
    from aenv.cluster.ca import CaError, init

    try:
        cert = init(directory)
    except (CaError, OSError) as e:
        raise CliError(str(e)) from None
    output.print_lines([f"CA made: {cert} (every member's cluster.ca_file)",
                        f"next: aenv cluster ca issue {directory} NAME --host HOST"])


@ca_app.command("issue")
def ca_issue(
    directory: Annotated[Path, typer.Argument(help="the CA's directory (aenv cluster ca init)")],
    name: Annotated[str, typer.Argument(help="the member: a node's or a gateway's name")],
    host: Annotated[list[str], typer.Option(
        "--host", help="a host name or address its URL uses (repeat for more)")],
    days: Annotated[int, typer.Option(help="validity", min=1, max=3650)] = 365,
) -> None:
    """A certificate and key for one node or gateway, signed by the cluster's CA."""
    from aenv.cluster.ca import CaError, issue

    try:
        cert, key = issue(directory, name, host, days)
    except (CaError, OSError, ValueError) as e:
        raise CliError(str(e)) from None
    output.print_lines([f"{name}: {cert} (cluster.cert_file), {key} (cluster.key_file)"])
