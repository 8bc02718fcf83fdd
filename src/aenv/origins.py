"""Where browsers and clients reach a node: its API's origin and its console's.

The console (docs/console.md) has an origin of its own: the data plane serves sandboxes' pages
on the API's origin (`/proxy/<id>/<port>/`), and a page there must not share an origin with
the page an API key is typed into. The API answers CORS for the console's origins only.
"""

from __future__ import annotations

import ipaddress

from aenv.config import Config

_ANY = {"0.0.0.0", "::", ""}


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _scheme(config: Config) -> str:
    return "https" if config.tls_cert_file is not None else "http"


def api_origin(config: Config, port: int | None = None) -> str:
    """The origin a client on this host reaches the API at: a node's (`port`), or a
    gateway's (`port` its own)."""
    if config.public_url:
        return config.public_url.rstrip("/")
    host = "127.0.0.1" if config.host in _ANY else config.host
    return f"{_scheme(config)}://{_host(host)}:{port or config.port}"


def console_port(config: Config, port: int | None = None) -> int:
    """The console's beside an API on `port` (a node's by default)."""
    return config.console_port or (port or config.port) + 2


def console_origins(config: Config, port: int | None = None) -> list[str]:
    """The origins the console beside an API on `port` is opened at: `console_origin` if
    set, else this host's console port under each name a browser on this host may give a
    loopback or any-address listener (the first is the one to print)."""
    if not config.console:
        return []
    if config.console_origin:
        return [config.console_origin.rstrip("/")]
    if config.host in _ANY or loopback_host(config.host):
        hosts = ["127.0.0.1", "localhost"]
    else:
        hosts = [config.host]
    return [f"{_scheme(config)}://{_host(h)}:{console_port(config, port)}" for h in hosts]


def loopback_host(host: str) -> bool:
    """This host: localhost or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
