"""What `aenv server` prints once it serves: where it is, where its key is, and the lines an
E2B client needs to reach it (README, "First steps")."""

from __future__ import annotations

import shlex

from aenv.api.auth import api_key_path
from aenv.config import Config
from aenv.origins import api_origin


def first_contact(config: Config, console: str | None = None) -> str:
    """`console`: the web console's origin, when it serves."""
    url = api_origin(config)
    if config.api_key:
        where, key = "from AENV_API_KEY", "$AENV_API_KEY"
    else:
        path = shlex.quote(str(api_key_path(config)))
        where, key = f"in {path}", f"$(cat {path})"
    lines = [f"aenv server: serving the E2B API at {url}", f"API key: {where}",
             "An E2B client (Python or JS SDK, e2b CLI) reaches it with:"]  # fmt: skip
    if config.domain and config.tls_cert_file is not None:
        lines.append(f"  export E2B_DOMAIN={config.domain}")  # api.<domain>, <port>-<id>.<domain>
    else:
        # The SDK's volume content API never falls back to E2B_API_URL.
        lines += [f"  export E2B_API_URL={url}", f"  export E2B_SANDBOX_URL={url}",
                  f"  export E2B_VOLUME_API_URL={url}"]  # fmt: skip
    lines.append(f"  export E2B_API_KEY={key}")
    if console is not None:
        lines.append(f"Web console: {console} (log in with the API key)")
    return "\n".join(lines)
