"""Asking a running guest, through its agent, whether it answers, to flush its filesystems,
or to run a process (`run_process`).

A filesystem-only pause keeps only the disk: the guest's dirty page cache lives in its RAM,
which that pause drops. So before the VM stops, the agent runs the tools drive's busybox
`sync` (`process.Process/Start`, a Connect server stream with one enveloped JSON request)
and the pause waits for it to end. The tools drive's busybox is used because the user
rootfs may have no `sync` (or no userland at all).
"""

from __future__ import annotations

import json
import struct

import httpx

from aenv.machines import agent_replies
from aenv.machines.agent_replies import GuestReplyError
from aenv.machines.api import GuestUnresponsive

# The tools drive is mounted at /.aenv in every guest (init-stage2.sh).
SYNC_ARGV = ("/.aenv/bin/busybox", "sync")
_END_STREAM = 0x02


def _envelope(message: dict[str, object]) -> bytes:
    payload = json.dumps(message, separators=(",", ":")).encode()
    return struct.pack(">BI", 0, len(payload)) + payload


def _end_event(data: bytes) -> dict[str, object] | None:
    """The process's `end` event from a Process/Start response body, or None."""
    end: dict[str, object] | None = None
    i = 0
    while i + 5 <= len(data):
        flags, n = struct.unpack(">BI", data[i:i + 5])
        msg = json.loads(data[i + 5:i + 5 + n] or b"{}")
        i += 5 + n
        if flags & _END_STREAM:
            if isinstance(msg, dict) and msg.get("error"):
                raise GuestUnresponsive(f"the guest agent failed the process: {msg['error']}")
            break
        event = msg.get("event") if isinstance(msg, dict) else None
        if isinstance(event, dict) and isinstance(event.get("end"), dict):
            end = event["end"]
    return end


async def check_agent(http: httpx.AsyncClient, base_url: str, timeout: float) -> None:
    """GuestUnresponsive unless the agent answers /health within `timeout`."""
    try:
        r = await agent_replies.request(http, "GET", base_url + "/health", deadline_s=timeout)
    except GuestReplyError as e:
        raise GuestUnresponsive(f"the guest agent did not answer /health: {e}") from e
    if r.status != 204:
        raise GuestUnresponsive(f"the guest agent answered /health with {r.status}")


async def run_process(
    http: httpx.AsyncClient, base_url: str, token: str | None, argv: tuple[str, ...],
    timeout: float, *, envs: dict[str, str] | None = None, pty: bool = False,
) -> dict[str, object] | None:  # fmt: skip
    """Run `argv` in the guest (on a terminal if `pty`) and wait for it: its `end` event,
    or None if the stream had none. GuestUnresponsive if the agent does not answer."""
    headers = {
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
        "Connect-Timeout-Ms": str(int(timeout * 1000)),
    }
    if token:
        headers["X-Access-Token"] = token
    process: dict[str, object] = {"cmd": argv[0], "args": list(argv[1:])}
    if envs:
        process["envs"] = envs
    message: dict[str, object] = {"process": process}
    if pty:
        message["pty"] = {"size": {"cols": 80, "rows": 24}}
    try:
        # The whole exchange within `timeout`, the reply within agent_replies' byte cap.
        r = await agent_replies.request(http, "POST", base_url + "/process.Process/Start",
                                        content=_envelope(message), headers=headers,
                                        deadline_s=timeout)  # fmt: skip
    except GuestReplyError as e:
        raise GuestUnresponsive(f"the guest agent did not run {argv[0]}: {e}") from e
    if r.status != 200:
        raise GuestUnresponsive(f"the guest agent answered {argv[0]} with {r.status}: "
                                f"{r.snippet()}")  # fmt: skip
    try:
        return _end_event(r.body)
    except (ValueError, RecursionError, struct.error) as e:
        raise GuestUnresponsive(f"the guest agent sent a malformed stream: {e}") from e


async def sync_filesystems(
    http: httpx.AsyncClient, base_url: str, token: str | None, timeout: float
) -> None:
    """Run `sync` in the guest and wait for it to exit 0; GuestUnresponsive otherwise."""
    end = await run_process(http, base_url, token, SYNC_ARGV, timeout)
    # protobuf JSON omits zero values: a clean exit has no exitCode.
    if end is None or not end.get("exited") or end.get("exitCode", 0) != 0:
        raise GuestUnresponsive(f"sync in the guest did not exit cleanly: {end}")
