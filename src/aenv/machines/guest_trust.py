"""A guest trusts the egress CA (network/interception_ca.py) while its policy has
`network.rules`: the node writes it through the agent, as a client's file write would.

- the system store: appended (once) to `/etc/ssl/certs/ca-certificates.crt`, which Debian,
  Ubuntu and Alpine (`/etc/ssl/cert.pem` points there) read, and made with the CA alone
  where an image has no store (busybox);
- `/usr/local/share/ca-certificates/aenv-egress.crt`, so `update-ca-certificates` keeps it;
- the environment of every process the agent starts from then on: `REQUESTS_CA_BUNDLE`
  and `SSL_CERT_FILE` (Python's requests, pip, httpx, certifi users) name the system store,
  `NODE_EXTRA_CA_CERTS` the CA (Node.js adds it to its own).

Idempotent: a resume or a fork runs it again and finds the CA in place. Once written, a
guest keeps trusting the CA after an update removes its rules, until it ends (only the
node holds the key, and it intercepts only the names a sandbox's rules list).
"""

from __future__ import annotations

import base64

import httpx

from aenv.machines import agent_replies
from aenv.machines.agent_replies import GuestReplyError

BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
ANCHOR = "/usr/local/share/ca-certificates/aenv-egress.crt"
ENV = {"REQUESTS_CA_BUNDLE": BUNDLE, "SSL_CERT_FILE": BUNDLE, "NODE_EXTRA_CA_CERTS": ANCHOR}
MARK = "# aenv egress CA\n"
MAX_BUNDLE = 4 << 20
DEADLINE_S = 30.0


class TrustError(RuntimeError):
    pass


async def trust(http: httpx.AsyncClient, agent_url: str, token: str | None, pem: str) -> None:
    """Raises TrustError if the agent refuses or does not answer."""
    headers = {"Authorization": "Basic " + base64.b64encode(b"root:").decode()}
    if token:
        headers["X-Access-Token"] = token
    try:
        r = await agent_replies.request(http, "GET", agent_url + "/files", params={
            "path": BUNDLE}, headers=headers, deadline_s=DEADLINE_S, max_bytes=MAX_BUNDLE)
        if r.status not in (200, 404):
            raise TrustError(f"reading {BUNDLE} answered {r.status}: {r.snippet()}")
        current = r.body.decode(errors="replace") if r.status == 200 else ""
        writes = [(ANCHOR, pem)]
        if pem.strip() not in current:
            sep = "" if not current or current.endswith("\n") else "\n"
            writes.append((BUNDLE, current + sep + MARK + pem))
        for path, text in writes:
            r = await agent_replies.request(
                http, "POST", agent_url + "/files", params={"path": path},
                content=text.encode(), deadline_s=DEADLINE_S,
                headers={**headers, "Content-Type": "application/octet-stream"})  # fmt: skip
            if r.status != 200:
                raise TrustError(f"writing {path} answered {r.status}: {r.snippet()}")
        r = await agent_replies.request(http, "POST", agent_url + "/init",
                                        json={"envVars": ENV}, deadline_s=DEADLINE_S)
        if r.status >= 300:
            raise TrustError(f"the agent's /init answered {r.status}: {r.snippet()}")
    except GuestReplyError as e:
        raise TrustError(str(e)) from None
