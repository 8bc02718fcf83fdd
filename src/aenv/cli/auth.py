"""`aenv auth`: save which node to talk to and its API key (see aenv.cli.settings)."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from aenv.cli import output, settings
from aenv.cli.client import ApiError, Node
from aenv.cli.errors import CliError


def _mask(key: str | None) -> str:
    if not key:
        return "(none)"
    return key[:6] + "..." + key[-2:] if len(key) > 12 else "*" * len(key)


def auth(
    url: Annotated[str | None, typer.Option(
        "--url", help="The node's URL [default: the current one, else http://127.0.0.1:8000]",
        show_default=False)] = None,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", "-k", help="The node's API key ('-' reads it from stdin).",
        show_default=False)] = None,
    show: Annotated[bool, typer.Option(
        "--show", help="Print the URL and key in use and where they come from.")] = False,
    verify: Annotated[bool, typer.Option(
        help="Check the URL and key against the node before saving.")] = True,
) -> None:
    """Log in to a node: save its URL and API key for later commands (file mode 0600).

    Without options, asks for both. AENV_URL / E2B_API_URL and AENV_API_KEY / E2B_API_KEY
    override what is saved. As root on the node's host no login is needed: the node's own
    key is used.
    """
    current = settings.load()
    if show:
        output.print_lines([
            f"url:     {current.url}  (from {current.url_source})",
            f"api key: {_mask(current.api_key)}  (from {current.key_source})",
            f"file:    {settings.config_path()}",
        ])  # fmt: skip
        return
    interactive = sys.stdin.isatty()
    if url is None:
        url = typer.prompt("Node URL", default=current.url) if interactive else current.url
    url = settings.normalize_url(url)
    if api_key == "-":
        api_key = sys.stdin.readline().strip()
    elif api_key is None:
        if not interactive:
            raise CliError("no API key given: use --api-key KEY (or --api-key - to read it "
                           "from stdin)")  # fmt: skip
        api_key = typer.prompt("API key", hide_input=True, default="", show_default=False)
        api_key = api_key.strip() or None
        if api_key is None:
            api_key = current.api_key
    if verify:
        s = settings.Settings(url, api_key, "--url", "the key given")
        with Node(s, timeout=10) as node:
            try:
                node.call("GET", "/v2/sandboxes", params={"limit": 1})
            except ApiError as e:
                raise CliError(f"{e.message}; nothing saved") from None
            except CliError as e:
                raise CliError(f"{e.message}; nothing saved (--no-verify saves anyway)") from None
    path = settings.write_file(url, api_key)
    output.print_lines([f"Saved {url} and its API key to {path}"])
    for var in (*settings.URL_VARS, *settings.KEY_VARS):
        if os.environ.get(var):
            output.warn(f"note: ${var} is set and overrides what was saved")
