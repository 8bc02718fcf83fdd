"""The node's REST API (E2B's control plane) as the CLI needs it, with errors as one line.

Every failure becomes a `CliError` worded for a person: the node is down, the key is wrong,
no such sandbox, an ambiguous id prefix, a feature this node does not have yet (501).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx

import aenv
from aenv.cli import settings as settings_mod
from aenv.cli.errors import CliError

CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 120.0  # creates, pauses and forks wait for a VM
PAGE = 100
FULL_ID = re.compile(r"[a-z0-9]{20}")  # the node's sandbox ids


def error_message(r: httpx.Response) -> str:
    """The node's `{"code", "message"}` error text, else the raw body, else the status."""
    try:
        body = r.json()
    except (ValueError, json.JSONDecodeError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str) and body["message"]:
        return body["message"]
    text = r.text.strip()
    if text and len(text) < 300:
        return text
    return f"HTTP {r.status_code} {r.reason_phrase}".strip()


class ApiError(CliError):
    """An HTTP error answer (status kept so callers can branch on 404/409/501)."""

    def __init__(self, status: int, message: str, unsupported: bool = False) -> None:
        CliError.__init__(self, message)
        self.status = status
        self.unsupported = unsupported  # the node has no such route (yet): 404/405/501


def transport_error(url: str, e: httpx.HTTPError) -> CliError:
    if isinstance(e, httpx.ConnectError):
        reason = str(e) or "connection failed"
        if "refused" in reason.lower():
            reason = "connection refused"
        return CliError(f"cannot reach the node at {url} ({reason}): is `aenv server` running?")
    if isinstance(e, httpx.TimeoutException):
        return CliError(f"the node at {url} did not answer in time ({type(e).__name__})")
    if isinstance(e, httpx.RemoteProtocolError):
        return CliError(f"the node at {url} closed the connection ({e})")
    return CliError(f"talking to the node at {url} failed: {type(e).__name__}: {e}")


class Node:
    """A client for one node. `origin` serves both the REST API and the data plane."""

    def __init__(self, settings: settings_mod.Settings | None = None,
                 timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.settings = settings or settings_mod.load()
        self.url = self.settings.url
        headers = {"User-Agent": f"aenv-cli/{aenv.__version__}"}
        if self.settings.api_key:
            headers["X-API-Key"] = self.settings.api_key
        self.http = httpx.Client(
            base_url=self.url, headers=headers,
            timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S),
        )  # fmt: skip

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def origin(self) -> str:
        u = httpx.URL(self.url)
        return str(u.copy_with(path="/", query=None, fragment=None)).rstrip("/")

    # --- plumbing ---------------------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            r = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise transport_error(self.url, e) from None
        if r.status_code == 401:
            s = self.settings
            if not s.api_key:
                raise CliError(f"the node at {self.url} needs an API key: "
                               "run `aenv auth` or set AENV_API_KEY")  # fmt: skip
            raise CliError(f"the node at {self.url} rejected the API key from {s.key_source}: "
                           "run `aenv auth` or set AENV_API_KEY")  # fmt: skip
        return r

    def call(self, method: str, path: str, ok: tuple[int, ...] = (200,), *,
             what: str = "", **kwargs: Any) -> httpx.Response:
        """A request that must answer one of `ok`; anything else is an ApiError."""
        r = self.request(method, path, **kwargs)
        if r.status_code in ok:
            return r
        msg = error_message(r)
        missing = r.status_code in (405, 501) or (
            r.status_code == 404 and msg.startswith("no route"))
        if missing and not re.search(r"not (supported|implemented)", msg):
            msg = f"{what or path}: this node does not implement it yet ({msg})"
        raise ApiError(r.status_code, msg, unsupported=missing)

    def json(self, method: str, path: str, ok: tuple[int, ...] = (200,), **kwargs: Any) -> Any:
        r = self.call(method, path, ok, **kwargs)
        try:
            return r.json()
        except ValueError:
            raise CliError(f"the node at {self.url} answered {method} {path} with "
                           "something that is not JSON") from None  # fmt: skip

    def paged(self, path: str, params: dict[str, Any],
              what: str = "") -> Iterator[dict[str, Any]]:
        token = None
        while True:
            q = dict(params, limit=PAGE)
            if token:
                q["nextToken"] = token
            r = self.call("GET", path, params=q, what=what)
            yield from r.json()
            token = r.headers.get("x-next-token")
            if not token:
                return

    # --- sandboxes --------------------------------------------------------------------------

    def sandboxes(self, state: str | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {}
        if state:
            params["state"] = state
        return list(self.paged("/v2/sandboxes", params))

    def sandbox(self, sandbox_id: str) -> dict[str, Any]:
        r = self.request("GET", f"/sandboxes/{quote(sandbox_id, safe='')}")
        if r.status_code == 404:
            raise ApiError(404, f"no such sandbox: {sandbox_id}")
        if r.status_code != 200:
            raise ApiError(r.status_code, error_message(r))
        return r.json()

    def resolve(self, prefix: str) -> str:
        """The id of the one sandbox whose id starts with `prefix` (like docker). A whole id
        is taken as it is (no listing): the call that uses it says if there is no such."""
        if FULL_ID.fullmatch(prefix):
            return prefix
        return resolve_prefix(prefix, [s["sandboxID"] for s in self.sandboxes()], "sandbox")

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        r = self.request("POST", "/v2/sandboxes", json=body)
        if r.status_code == 201:
            return r.json()
        msg = error_message(r)
        if r.status_code == 404:
            msg = f"{msg} (see `aenv template ls`)"
        elif r.status_code == 429:
            msg = f"the node is at capacity: {msg}"
        raise ApiError(r.status_code, msg)

    def sandbox_call(self, method: str, sandbox_id: str, suffix: str, ok: tuple[int, ...],
                     what: str, **kwargs: Any) -> httpx.Response:
        path = f"/sandboxes/{quote(sandbox_id, safe='')}{suffix}"
        try:
            return self.call(method, path, ok, what=what, **kwargs)
        except ApiError as e:
            if e.status == 404 and not e.unsupported:
                raise ApiError(404, f"no such sandbox: {sandbox_id}") from None
            raise

    def kill(self, sandbox_id: str) -> None:
        self.sandbox_call("DELETE", sandbox_id, "", (204,), "rm")

    def connect(self, sandbox_id: str, timeout: int | None = None) -> tuple[dict[str, Any], bool]:
        """POST /v2/sandboxes/{id}/connect: (sandbox, resumed?). Resumes a paused sandbox."""
        body = {} if timeout is None else {"timeout": timeout}
        r = self.call("POST", f"/v2/sandboxes/{quote(sandbox_id, safe='')}/connect", (200, 201),
                      what="resume", json=body)
        return r.json(), r.status_code == 201

    def refresh(self, sandbox_id: str, duration: int) -> None:
        self.sandbox_call("POST", sandbox_id, "/refreshes", (204,), "keep-alive",
                          json={"duration": duration})

    # --- templates and snapshots ------------------------------------------------------------

    def templates(self) -> list[dict[str, Any]]:
        return self.json("GET", "/templates")

    def snapshots(self, sandbox_id: str | None = None) -> list[dict[str, Any]]:
        params = {"sandboxID": sandbox_id} if sandbox_id else {}
        return list(self.paged("/snapshots", params, what="listing snapshots"))


def resolve_prefix(prefix: str, ids: list[str], kind: str) -> str:
    if not prefix:
        raise CliError(f"empty {kind} id")
    if prefix in ids:
        return prefix
    matches = sorted({i for i in ids if i.startswith(prefix)})
    if not matches:
        raise CliError(f"no such {kind}: {prefix}")
    if len(matches) > 1:
        shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise CliError(f"ambiguous {kind} id prefix '{prefix}' "
                       f"({len(matches)} matches: {shown})")  # fmt: skip
    return matches[0]
