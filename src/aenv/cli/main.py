"""The `aenv` command line (typer). Each subcommand is a thin shell over a library call."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

import aenv
from aenv import config as aenv_config
from aenv.cli.setup import setup

app = typer.Typer(
    name="aenv",
    help="Self-hosted microVM sandboxes that speak the E2B API.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="TOML file (default: $AENV_CONFIG, /etc/aenv/config.toml)"),
]


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        typer.echo(aenv.__version__)
        raise typer.Exit()


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
    from aenv.api.server import run
    from aenv.orchestrator.factory import RuntimeUnavailable

    cfg = aenv_config.load(config, host=host, port=port, log_level=log_level)
    try:
        code = run(cfg)
    except RuntimeUnavailable as e:
        typer.echo(f"aenv server: {e}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


# --- `aenv setup`: kernel, tools drive, templates (src/aenv/cli/setup.py) ------------------
app.command()(setup)
# ------------------------------------------------------------------------------------------


if __name__ == "__main__":
    app()
