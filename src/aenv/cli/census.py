"""`aenv census`: every host resource aenv owns, per node instance, checked against the
sandbox records (`aenv.orchestrator.census`). Runs on the node's host, as root; exits 1 when
something leaked or a record has lost what its state needs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from aenv.cli import output
from aenv.cli.errors import EXIT_ERROR


def census(
    instance: Annotated[str | None, typer.Option(
        "--instance", "-i", help="Only this node instance (default: every instance).",
        show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Census and diff as JSON.")] = False,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Sandbox snapshots count as leaks too (after a test run).")] = False,
    baseline: Annotated[Path | None, typer.Option(
        "--baseline", help="An earlier `aenv census --json` output: what it already found "
        "is listed as pre-existing and does not fail the check.", show_default=False)] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="TOML file (default: $AENV_CONFIG, /etc/aenv/config.toml)",
        show_default=False)] = None,
) -> None:
    """List what aenv holds on this host and what no sandbox record explains."""
    from aenv import config as aenv_config
    from aenv.orchestrator import census as census_mod

    cfg = aenv_config.load(config)
    c = census_mod.census(cfg, instance)
    d = census_mod.diff(c, strict=strict)
    before = census_mod.Diff()
    if baseline is not None:
        d, before = d.split(_read_baseline(baseline))
    if as_json:
        output.print_json({"census": c.to_json(), **d.to_json(), "clean": d.clean,
                           **({"pre_existing": before.to_json()} if baseline else {})})
    else:
        counts = Counter((r.instance or "-", r.kind) for r in c.resources)
        rows = []
        for inst in sorted({i for i, _ in counts}):
            kinds = ", ".join(f"{k} {counts[inst, k]}" for k in census_mod.KINDS
                              if counts[inst, k])  # fmt: skip
            state = "live" if inst in c.live else ""
            rows.append([inst, state, str(len(c.records.get(inst, {}))), kinds])
        output.print_table(["INSTANCE", "NODE", "RECORDS", "RESOURCES"], rows)
        output.print_lines([f"pre-existing {line}" for line in before.lines()])
        output.print_lines(d.lines() or ["census: clean"])
    if not d.clean:
        raise typer.Exit(EXIT_ERROR)


def _read_baseline(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise typer.BadParameter(f"{path}: not an `aenv census --json` output ({e})") from e
    if not isinstance(data, dict):
        raise typer.BadParameter(f"{path}: not an `aenv census --json` output")
    return data
