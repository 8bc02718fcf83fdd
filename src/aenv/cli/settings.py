"""Which node the CLI talks to, and with which key.

Looked up in this order (first wins), separately for the URL and the key:

1. environment: `AENV_URL` or `E2B_API_URL`; `AENV_API_KEY` or `E2B_API_KEY`;
2. the file `aenv auth` writes: `$XDG_CONFIG_HOME/aenv/config.json` (default
   `~/.config/aenv/config.json`, mode 0600; `AENV_CLI_CONFIG` names another file);
3. on the node's own host: the node's configuration (`/etc/aenv/config.toml`, `AENV_*`), i.e.
   `http://<host>:<port>` and its `api_key`, else, as root, the key the node generated in
   `<data_dir>/api_key` (see `aenv.api.auth`);
4. the URL defaults to `http://127.0.0.1:8000`.

A bad URL or key is one line naming where it came from (`E2B_API_URL: 'ftp://x' must be an
http(s) URL ...`; a key's value is never shown) and exit 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from aenv.cli.errors import EXIT_CONFIG, CliError
from aenv.config_errors import HIDDEN, show_value

DEFAULT_URL = "http://127.0.0.1:8000"
URL_VARS = ("AENV_URL", "E2B_API_URL")
KEY_VARS = ("AENV_API_KEY", "E2B_API_KEY")
# An X-API-Key header value: printable ASCII, no spaces at either end (servers strip them).
_KEY = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")


@dataclass(frozen=True)
class Settings:
    url: str
    api_key: str | None
    url_source: str
    key_source: str


def config_path() -> Path:
    if os.environ.get("AENV_CLI_CONFIG"):
        return Path(os.environ["AENV_CLI_CONFIG"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "aenv" / "config.json"


def read_file() -> dict[str, str]:
    path = config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise CliError(f"cannot read {path}: {e}; fix it or run `aenv auth` again") from None
    if not isinstance(data, dict):
        raise CliError(f"{path} is not a JSON object; run `aenv auth` again")
    return {k: v for k, v in data.items() if isinstance(v, str)}


def write_file(url: str, api_key: str | None) -> Path:
    """Store the URL and key, readable by the user only (0600 file in a 0700 directory)."""
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data: dict[str, str] = {"url": url}
    if api_key:
        data["api_key"] = api_key
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (json.dumps(data, indent=2) + "\n").encode())
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def _node_local() -> tuple[str | None, str | None, str]:
    """(url, key, where the key came from) from this host's node configuration, if any."""
    try:
        from aenv import config as node_config

        cfg = node_config.load()
    except Exception:
        return None, None, ""
    host = cfg.host if cfg.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    url = f"http://{host}:{cfg.port}"
    if cfg.api_key:
        return url, cfg.api_key, "the node's configuration"
    key_file = cfg.data_dir / "api_key"  # aenv.api.auth.api_key_path
    with contextlib.suppress(OSError):
        key = key_file.read_text().strip()
        if key:
            return url, key, str(key_file)
    return url, None, ""


def _env(names: tuple[str, ...]) -> tuple[str | None, str]:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value, f"${name}"
    return None, ""


def load() -> Settings:
    url, url_source = _env(URL_VARS)
    key, key_source = _env(KEY_VARS)
    if url is None or key is None:
        stored = read_file()
        if url is None and stored.get("url"):
            url, url_source = stored["url"], str(config_path())
        if key is None and stored.get("api_key"):
            key, key_source = stored["api_key"], str(config_path())
    if url is None or key is None:
        local_url, local_key, local_source = _node_local()
        if url is None and local_url:
            url, url_source = local_url, "the node's configuration"
        if key is None and local_key:
            key, key_source = local_key, local_source
    if url is None:
        url, url_source = DEFAULT_URL, "default"
    if key is not None and not _KEY.fullmatch(key):
        raise CliError(f"{_setting(key_source, 'api_key')}: {HIDDEN} must be printable ASCII "
                       f"with no space at either end", EXIT_CONFIG)  # fmt: skip
    return Settings(normalize_url(url, _setting(url_source, "url")), key, url_source,
                    key_source or "none")  # fmt: skip


def _setting(source: str, key: str) -> str:
    """How a message names a setting from `source` ("$E2B_API_URL", a file, the node's)."""
    if source.startswith("$"):
        return source[1:]
    if source in ("default", "the node's configuration"):
        return f"the {key} from {source}"
    return f"{key} in {source}"  # a file


def normalize_url(url: str, setting: str | None = None) -> str:
    """`host:port` -> `http://host:port`, no trailing slash. A URL that is not http(s) with a
    host is a CliError naming `setting` (the env var or file it came from), if given."""
    import httpx

    given = url
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    try:
        host = httpx.URL(url).host
    except httpx.InvalidURL:
        host = ""
    if not url.startswith(("http://", "https://")) or not host or any(c.isspace() for c in url):
        if setting is None:
            raise CliError(f"not an http(s) URL: {show_value(given, False)}")
        raise CliError(f"{setting}: {show_value(given, False)} must be an http(s) URL "
                       f"(http[s]://host[:port])", EXIT_CONFIG)  # fmt: skip
    return url
