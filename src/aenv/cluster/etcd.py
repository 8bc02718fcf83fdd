"""etcd v3 over its own JSON gateway (`/v3/...`, etcd >= 3.4), with httpx.

etcd serves its gRPC API as HTTP/JSON too, so the cluster plane needs no gRPC stack and no
unmaintained client library (PyPI `etcd3` was last released in 2020). Keys and values are
bytes, base64 in JSON; int64 fields come back as strings. Only what aenv uses is here:
ranges, puts, deletes, transactions, leases and watches.

Several endpoints may be given (the members of one cluster): a request that cannot connect
to one is tried on the next, and the one that answered is tried first from then on. While
the cluster is unavailable (no member answers, or it is electing a leader) a request is
retried, with backoff, for up to `retry_s`. A write retried after "leader changed" may
have been applied the first time: callers guard their writes with compares and check what
they find (`placement.place` does).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import httpx

from aenv.origins import loopback_host

if TYPE_CHECKING:
    from aenv.config import ClusterConfig

log = logging.getLogger("aenv.cluster")

CONNECT_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 5.0
# How long a request keeps being retried while the cluster is unavailable (no member
# reachable, no leader, an election under way: "leader changed").
RETRY_S = 5.0


class EtcdError(Exception):
    """etcd answered with an error (bad request, lease not found, ...)."""


class EtcdUnavailable(EtcdError):
    """No endpoint could be reached, or the cluster has no leader."""


class EtcdRefused(EtcdError):
    """The link to etcd is not what this configuration allows (plain text off this host, no
    authentication, a certificate that does not verify): one line saying why."""


@dataclass(frozen=True)
class EtcdSecurity:
    """How aenv reaches etcd: TLS (the CA that signs etcd's certificate, and a client
    certificate for etcd's --client-cert-auth) and etcd's own users (a token asked with the
    password, asked again when etcd no longer takes it)."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    user: str = ""
    password: str = ""
    insecure: bool = False  # plain text off this host, or no authentication, allowed

    @classmethod
    def of(cls, c: ClusterConfig) -> EtcdSecurity:
        return cls(c.etcd_ca_file, c.etcd_cert_file, c.etcd_key_file, c.etcd_user,
                   c.etcd_password, c.etcd_insecure)  # fmt: skip

    @property
    def authenticated(self) -> bool:
        return self.cert_file is not None or bool(self.user)

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.cert_file is not None:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        return ctx

    def check(self, endpoints: Sequence[str]) -> None:
        """EtcdRefused for an endpoint off this host without authentication (unless
        `insecure`: then a warning); a warning for one off this host over plain HTTP."""
        for e in endpoints:
            u = urlsplit(e)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise EtcdRefused(f"etcd endpoint {e!r} is not an http(s)://host:port URL")
            if loopback_host(u.hostname):
                continue
            if not self.authenticated:
                if not self.insecure:
                    raise EtcdRefused(
                        f"etcd endpoint {e} is not on this host and aenv has no credential "
                        "for it: give cluster.etcd_cert_file (with https:// and "
                        "etcd_ca_file) or etcd_user, or set cluster.etcd_insecure")
                log.warning("etcd endpoint %s: no authentication (cluster.etcd_insecure): "
                            "anyone who reaches it reads and writes the cluster's state", e)
            if u.scheme == "http":
                log.warning("etcd endpoint %s is plain HTTP: what crosses the link (bindings, "
                            "sealed secrets, team key digests, credentials) is readable on "
                            "the network; use https:// with cluster.etcd_ca_file", e)

    def protects(self, endpoints: Sequence[str]) -> bool:
        """Whether what is written to etcd stays between this host and etcd: every endpoint
        on this host, or reached over https with authentication."""
        return all(loopback_host(urlsplit(e).hostname or "") or
                   (e.startswith("https:") and self.authenticated) for e in endpoints)


def _b64(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: bytes | str) -> bytes:
    """The range end that makes a range of every key starting with `prefix`."""
    raw = bytearray(prefix.encode() if isinstance(prefix, str) else prefix)
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"  # every key


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, kv: dict[str, Any]) -> KeyValue:
        return cls(
            key=_unb64(kv.get("key")).decode(), value=_unb64(kv.get("value")),
            create_revision=int(kv.get("create_revision", 0)),
            mod_revision=int(kv.get("mod_revision", 0)),
            version=int(kv.get("version", 0)), lease=int(kv.get("lease", 0)),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: Literal["PUT", "DELETE"]
    kv: KeyValue
    revision: int  # the revision of the response that carried it


# -- transaction parts (etcd's Compare and RequestOp, as JSON) --------------------------
def compare_version(key: str, op: Literal["EQUAL", "GREATER", "LESS", "NOT_EQUAL"],
                    version: int) -> dict[str, Any]:
    """Compare a key's version (0: the key does not exist)."""
    return {"key": _b64(key), "target": "VERSION", "result": op, "version": str(version)}


def compare_mod(key: str, op: Literal["EQUAL", "GREATER", "LESS", "NOT_EQUAL"],
                revision: int) -> dict[str, Any]:
    """Compare a key's last modification revision (0 if it does not exist)."""
    return {"key": _b64(key), "target": "MOD", "result": op, "mod_revision": str(revision)}


def compare_range_mod_below(prefix: str, revision: int) -> dict[str, Any]:
    """Every key under `prefix` was last modified before `revision`: none written since a
    read at `revision - 1`, and none created (etcd 3.3+ compares over a range)."""
    return {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix)), "target": "MOD",
            "result": "LESS", "mod_revision": str(revision)}  # fmt: skip


def put_op(key: str, value: bytes | str, lease: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return {"request_put": body}


def delete_op(key: str) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key)}}


def range_op(key: str) -> dict[str, Any]:
    return {"request_range": {"key": _b64(key)}}


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    responses: list[dict[str, Any]]

    def ranges(self) -> list[list[KeyValue]]:
        """The key-values of each range request the transaction ran, in order."""
        return [[KeyValue.from_json(kv) for kv in r["response_range"].get("kvs", [])]
                for r in self.responses if "response_range" in r]  # fmt: skip


class Etcd:
    """An async client of one etcd cluster (see the module docstring)."""

    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = REQUEST_TIMEOUT_S,
                 retry_s: float = RETRY_S, security: EtcdSecurity | None = None) -> None:
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint")
        self.security = security or EtcdSecurity()
        self.security.check(endpoints)
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.retry_s = retry_s
        tls = any(e.startswith("https:") for e in self.endpoints)
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S), trust_env=False,
            verify=self.security.ssl_context() if tls else True,
        )  # fmt: skip
        self._token: str | None = None  # etcd's auth token, for `security.user`
        self._token_lock = asyncio.Lock()

    @classmethod
    def of(cls, c: ClusterConfig) -> Etcd:
        """The client a node, a gateway or the CLI uses: the configured endpoints, over the
        configured link (EtcdRefused if it is not allowed)."""
        return cls(c.etcd_endpoints, security=EtcdSecurity.of(c))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _authenticate(self, stale: str | None) -> str:
        """etcd's token for the user (asked again when `stale` is the one it refused)."""
        async with self._token_lock:
            if self._token is None or self._token == stale:
                sec = self.security
                try:
                    out = await self._post_once("/v3/auth/authenticate",
                                                {"name": sec.user, "password": sec.password},
                                                auth=False)  # fmt: skip
                except EtcdUnavailable:
                    raise
                except EtcdError as e:
                    if isinstance(e, EtcdRefused):
                        raise
                    if "not enabled" in str(e) and not sec.insecure:
                        raise EtcdRefused("etcd has authentication off (an etcd user is "
                                          "configured): enable it, or set "
                                          "cluster.etcd_insecure") from None
                    if "not enabled" in str(e):
                        return ""
                    raise EtcdRefused(f"etcd refused user {sec.user!r}: {e}") from None
                self._token = str(out.get("token", ""))
            return self._token

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + self.retry_s
        delay = 0.05
        while True:
            try:
                return await self._post_once(path, body)
            except _TokenRefused as e:  # expired (or etcd restarted): a new one, once
                await self._authenticate(e.token)
                return await self._post_once(path, body)
            except EtcdUnavailable:
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    async def _headers(self) -> dict[str, str]:
        if not self.security.user:
            return {}
        token = self._token if self._token is not None else await self._authenticate(None)
        return {"Authorization": token} if token else {}

    async def _post_once(self, path: str, body: dict[str, Any], *,
                         auth: bool = True) -> dict[str, Any]:  # fmt: skip
        last: Exception | None = None
        headers = await self._headers() if auth else {}
        for i, base in enumerate(list(self.endpoints)):
            try:
                r = await self._http.post(base + path, json=body, headers=headers)
            except ssl.SSLError as e:  # raised as it is on some handshakes
                raise EtcdRefused(f"etcd at {base}: TLS failed: {e}") from None
            except httpx.TransportError as e:
                if (why := _tls_failure(e)) is not None:
                    raise EtcdRefused(f"etcd at {base}: TLS failed: {why}") from None
                last = e
                continue
            if i:  # this one answered: ask it first next time
                self.endpoints.insert(0, self.endpoints.pop(i))
            try:
                return _answer(r)
            except EtcdError as e:
                if headers and "invalid auth token" in str(e):
                    raise _TokenRefused(headers["Authorization"]) from None
                if "CommonName of client" in str(e):
                    raise EtcdRefused(
                        "etcd refuses a client certificate with a common name on its JSON "
                        "gateway once its authentication is on: give aenv a certificate "
                        "without a CN (for TLS) and an etcd user (cluster.etcd_user)"
                    ) from None
                raise
        hint = ""
        if isinstance(last, httpx.ReadError | httpx.RemoteProtocolError) and \
                any(e.startswith("https:") for e in self.endpoints):
            hint = (" (etcd closed the TLS connection: does it require a client certificate "
                    "(cluster.etcd_cert_file), or refuse this one?)")
        why = str(last) or type(last).__name__
        raise EtcdUnavailable(f"no etcd endpoint answered ({', '.join(self.endpoints)}): "
                              f"{why}{hint}")

    # -- keys ----------------------------------------------------------------------------
    async def get(self, key: str) -> KeyValue | None:
        out = await self._post("/v3/kv/range", {"key": _b64(key)})
        kvs = out.get("kvs", [])
        return KeyValue.from_json(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under `prefix`, and the revision they were read at (to watch from)."""
        out = await self._post("/v3/kv/range", {"key": _b64(prefix),
                                                "range_end": _b64(prefix_end(prefix))})
        return ([KeyValue.from_json(kv) for kv in out.get("kvs", [])],
                int(out["header"]["revision"]))  # fmt: skip

    async def put(self, key: str, value: bytes | str, *, lease: int = 0) -> int:
        """Returns the revision of the write."""
        out = await self._post("/v3/kv/put", put_op(key, value, lease)["request_put"])
        return int(out["header"]["revision"])

    async def delete(self, key: str) -> int:
        """Returns how many keys were deleted (0 or 1)."""
        out = await self._post("/v3/kv/deleterange", {"key": _b64(key)})
        return int(out.get("deleted", 0))

    async def txn(self, compare: list[dict[str, Any]], success: list[dict[str, Any]],
                  failure: list[dict[str, Any]] | None = None) -> TxnResult:
        """All of `compare` true: run `success`, else `failure`; atomically."""
        out = await self._post("/v3/kv/txn", {"compare": compare, "success": success,
                                              "failure": failure or []})
        return TxnResult(bool(out.get("succeeded", False)), int(out["header"]["revision"]),
                         out.get("responses", []))  # fmt: skip

    # -- leases --------------------------------------------------------------------------
    async def grant(self, ttl_s: int) -> int:
        out = await self._post("/v3/lease/grant", {"TTL": str(ttl_s)})
        return int(out["ID"])

    async def keepalive(self, lease: int) -> int:
        """Renew `lease` once. Returns its TTL, 0 if it has expired (or never existed)."""
        out = await self._post("/v3/lease/keepalive", {"ID": str(lease)})
        return int(out.get("result", {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """End `lease` now, and with it every key attached to it."""
        try:
            await self._post("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdError as e:
            if "not found" not in str(e):
                raise

    # -- watches -------------------------------------------------------------------------
    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Every change under `prefix` from `start_revision` on, until the caller stops or
        the connection ends (EtcdUnavailable: read again and watch from the new revision)."""
        body = {"create_request": {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix)),
                                   "start_revision": str(start_revision)}}
        timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
        headers = await self._headers()
        for base in list(self.endpoints):
            try:
                async with self._http.stream("POST", base + "/v3/watch", json=body,
                                             headers=headers, timeout=timeout) as r:
                    if r.status_code != 200:
                        try:
                            _answer(httpx.Response(r.status_code, content=await r.aread()))
                        except EtcdError as e:
                            if "invalid auth token" not in str(e):
                                raise
                            await self._authenticate(headers.get("Authorization"))
                            raise EtcdUnavailable("the auth token expired: watch "
                                                  "again") from None
                    async for line in r.aiter_lines():
                        for ev in _watch_events(line):
                            yield ev
                    raise EtcdUnavailable("the watch stream ended")
            except httpx.TransportError:
                continue
        raise EtcdUnavailable("no etcd endpoint took the watch")


def _tls_failure(e: BaseException) -> str | None:
    """What TLS refused, if that is why the request failed (a certificate that does not
    verify, or one the server asked for and did not get: TLS 1.3 says so only on a read)."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return None


class _TokenRefused(EtcdError):
    def __init__(self, token: str) -> None:
        super().__init__("etcd refused the auth token")
        self.token = token


def _watch_events(line: str) -> list[WatchEvent]:
    if not line.strip():
        return []
    msg = json.loads(line)
    if "error" in msg:
        raise EtcdError(f"watch: {msg['error'].get('message', msg['error'])}")
    result = msg.get("result", {})
    if result.get("compact_revision") and not result.get("events"):
        raise EtcdError(f"watch: revision compacted (at {result['compact_revision']})")
    rev = int(result.get("header", {}).get("revision", 0))
    return [WatchEvent(type=e.get("type", "PUT"), kv=KeyValue.from_json(e["kv"]), revision=rev)
            for e in result.get("events", [])]  # fmt: skip


def _answer(r: httpx.Response) -> dict[str, Any]:
    try:
        body = r.json()
    except ValueError:
        body = {"message": r.text[:200]}
    if r.status_code == 200:
        return body
    message = body.get("message") or body.get("error") or r.reason_phrase
    if r.status_code in (502, 503, 504) or any(
            m in str(message) for m in ("no leader", "leader changed", "timed out")):
        raise EtcdUnavailable(f"etcd: {message}")
    raise EtcdError(f"etcd: {message}")
