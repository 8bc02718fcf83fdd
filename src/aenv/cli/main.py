"""The `aenv` command line (typer). Each subcommand is a thin shell over an API or library call.

Commands live in sibling modules (sandboxes, transfer, templates, snapshots, auth); this one
wires them up. Heavy imports (the node, the runtime, the builder) happen inside the commands
that need them, so `aenv ls` and shell completion start quickly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

import aenv
from aenv.cli import (
    census,
    cluster,
    completion,
    images,
    logs,
    sandboxes,
    snapshots,
    teams,
    templates,
    transfer,
)
from aenv.cli.auth import auth
from aenv.cli.errors import AenvTyper

app = AenvTyper(
    name="aenv",
    help="Self-hosted microVM sandboxes that speak the E2B API.\n\n"
    "IDs may be any unique prefix of a sandbox id. Connection: `aenv auth`, or AENV_URL and "
    "AENV_API_KEY.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="TOML file (default: $AENV_CONFIG, /etc/aenv/config.toml)"),
]


@app.callback(invoke_without_command=True)
def _main(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        typer.echo(aenv.__version__)
        raise typer.Exit()
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit()


# --- sandboxes ------------------------------------------------------------------------------
app.command("start")(sandboxes.start)
app.command("ls")(sandboxes.ls)
app.command("exec", context_settings={"allow_interspersed_args": False})(sandboxes.exec_)
app.command("cn")(sandboxes.cn)
app.command("pause")(sandboxes.pause)
app.command("resume")(sandboxes.resume)
app.command("rm")(sandboxes.rm)
app.command("timeout")(sandboxes.timeout)
app.command("fork")(sandboxes.fork)
app.command("logs")(logs.logs)
app.command("upload")(transfer.upload)
app.command("download")(transfer.download)
app.add_typer(snapshots.app, name="snapshot")
app.add_typer(templates.app, name="template")
app.command("pull")(images.pull)
app.command("auth")(auth)
app.command("completion")(completion.completion)
app.command("census")(census.census)
app.add_typer(teams.team_app, name="team")
app.add_typer(teams.key_app, name="key")
app.add_typer(cluster.app, name="cluster")
app.add_typer(cluster.node_app, name="node")


# --- the node -------------------------------------------------------------------------------
@app.command()
def server(
    host: Annotated[str | None, typer.Option(help="Listen address [env AENV_HOST]")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port [env AENV_PORT]")] = None,
    log_level: Annotated[
        str | None, typer.Option(help="debug|info|warning|error [env AENV_LOG_LEVEL]")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Run the node: E2B-compatible control plane and data-plane proxy on one origin."""
    from aenv import config as aenv_config
    from aenv.api.server import run
    from aenv.orchestrator.factory import RuntimeUnavailable

    cfg = aenv_config.load(config, host=host, port=port, log_level=log_level)
    try:
        code = run(cfg)
    except RuntimeUnavailable as e:
        typer.echo(f"aenv server: {e}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


@app.command()
def gateway(
    host: Annotated[str | None, typer.Option(help="Listen address [env AENV_HOST]")] = None,
    port: Annotated[
        int | None, typer.Option(help="Listen port [env AENV_GATEWAY_PORT, default 8080]")
    ] = None,
    log_level: Annotated[
        str | None, typer.Option(help="debug|info|warning|error [env AENV_LOG_LEVEL]")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Run a cluster gateway: the whole E2B API of the cluster's nodes on one origin."""
    from aenv import config as aenv_config
    from aenv.cluster.gateway.server import run

    cfg = aenv_config.load(config, host=host, log_level=log_level)
    raise typer.Exit(run(cfg, port))


# `aenv setup` lives in src/aenv/cli/setup.py; this wrapper only defers its (slow) imports.
@app.command()
def setup(
    template: list[str] = typer.Option(  # noqa: B008
        ["base"], "--template", "-t",
        help="NAME[=RECIPE] to build (recipes: debian, familiar, busybox; `base` alone: "
             "the familiar base beside base-minimal)"),
    force: bool = typer.Option(False, help="rebuild templates even if up to date"),
    minimal_base: bool = typer.Option(
        False, envvar="AENV_MINIMAL_BASE",
        help="make `base` the minimal Debian instead of the familiar base built on it"),
    defer_base: bool = typer.Option(
        False, help="leave a missing familiar `base` to the node, which makes it once it "
                    "serves (`make run`)"),
) -> None:
    """Prepare this host: data filesystem, guest kernel, tools drive, templates."""
    from aenv.cli.setup import setup as run_setup

    run_setup(template=template, force=force, minimal_base=minimal_base, defer_base=defer_base)


if __name__ == "__main__":
    app()
