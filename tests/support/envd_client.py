"""A minimal envd (Connect JSON) client for runtime tests that run below the node API."""

from __future__ import annotations

import base64
import json
import struct

import httpx


def _envelopes(data: bytes) -> list[tuple[int, dict]]:
    out, i = [], 0
    while i + 5 <= len(data):
        flags, n = struct.unpack(">BI", data[i : i + 5])
        out.append((flags, json.loads(data[i + 5 : i + 5 + n] or b"{}")))
        i += 5 + n
    return out


def run(
    base_url: str,
    cmd: str,
    token: str | None = None,
    timeout: float = 30.0,
    user: str | None = None,
) -> tuple[int, str, str]:
    """Run `bash -l -c cmd` through Process/Start; return (exit_code, stdout, stderr)."""
    msg = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}}).encode()
    headers = {
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
        "Connect-Timeout-Ms": str(int(timeout * 1000)),
    }
    if token:
        headers["X-Access-Token"] = token
    if user:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:".encode()).decode()
    r = httpx.post(
        base_url + "/process.Process/Start",
        headers=headers,
        content=struct.pack(">BI", 0, len(msg)) + msg,
        timeout=timeout + 5,
    )
    r.raise_for_status()
    out, err, code = b"", b"", None
    for flags, body in _envelopes(r.content):
        if flags & 2:
            if "error" in body:
                raise RuntimeError(f"envd error: {body['error']}")
            continue
        ev = body.get("event", {})
        if "data" in ev:
            out += base64.b64decode(ev["data"].get("stdout", ""))
            err += base64.b64decode(ev["data"].get("stderr", ""))
        if "end" in ev:
            code = int(ev["end"].get("exitCode", 0))
    if code is None:
        raise RuntimeError("stream ended without an end event")
    return code, out.decode(errors="replace"), err.decode(errors="replace")
