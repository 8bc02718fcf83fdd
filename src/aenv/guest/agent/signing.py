"""Signed /files URLs (e2b-compat.md 6.2): ``v1_`` + base64(sha256(path:op:user:token[:exp]))."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

READ = "read"
WRITE = "write"


def signature(path: str, operation: str, username: str, token: str, expiration: int | None) -> str:
    """The signature the SDK computes for a download/upload URL."""
    raw = f"{path}:{operation}:{username}:{token}"
    if expiration is not None:
        raw += f":{expiration}"
    digest = hashlib.sha256(raw.encode("utf-8")).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode("ascii")


def check_signature(
    *,
    path: str,
    operation: str,
    username: str | None,
    token: str,
    presented: str | None,
    expiration: str | None,
    now: float | None = None,
) -> str | None:
    """Verify a presented signature. Returns None if valid, else the reason it is not."""
    if not presented:
        return "missing signature query parameter"
    exp: int | None = None
    if expiration is not None and expiration != "":
        try:
            exp = int(expiration)
        except ValueError:
            return "invalid signature expiration"
    expected = signature(path, operation, username or "", token, exp)
    if not hmac.compare_digest(expected.encode(), presented.encode()):
        return "invalid signature"
    if exp is not None and exp < (time.time() if now is None else now):
        return "signature is already expired"
    return None
