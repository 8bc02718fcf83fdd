"""The wire contract below the SDK: Connect framing and error mapping, the access token,
signed URLs, /files details (Range, gzip, errors), /init, /envs, /metrics, robustness."""

from __future__ import annotations

import base64
import gzip
import json
import struct
import time
import urllib.error
import urllib.request
import uuid

import httpx
import pytest
from e2b import AuthenticationException, Sandbox

from tests.integration.guest.sdk.conftest import SANDBOX_ENV

CONNECT_STREAM = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
CONNECT_UNARY = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}


def envelope(msg: dict, flags: int = 0) -> bytes:
    body = json.dumps(msg).encode()
    return struct.pack(">BI", flags, len(body)) + body


def parse_envelopes(data: bytes) -> list[tuple[int, dict]]:
    out, i = [], 0
    while i < len(data):
        flags, n = struct.unpack(">BI", data[i : i + 5])
        out.append((flags, json.loads(data[i + 5 : i + 5 + n])))
        i += 5 + n
    return out


@pytest.fixture
def client(agent_url: str, token: str) -> httpx.Client:
    with httpx.Client(base_url=agent_url, headers={"X-Access-Token": token}, timeout=30) as c:
        yield c


def start(client: httpx.Client, cmd: str, **headers: str) -> list[tuple[int, dict]]:
    req = {"process": {"cmd": "/bin/bash", "args": ["-c", cmd]}, "stdin": False}
    r = client.post(
        "/process.Process/Start", content=envelope(req), headers={**CONNECT_STREAM, **headers}
    )
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/connect+json"
    return parse_envelopes(r.content)


# --- Connect framing ------------------------------------------------------------------------


def test_server_stream_framing(client: httpx.Client) -> None:
    frames = start(client, "echo hi")
    assert [f for f, _ in frames] == [0, 0, 0, 2]
    assert set(frames[0][1]["event"]["start"]) == {"pid"}
    assert frames[1][1] == {"event": {"data": {"stdout": base64.b64encode(b"hi\n").decode()}}}
    assert frames[2][1] == {"event": {"end": {"exited": True, "status": "exit status 0"}}}
    assert frames[3][1] == {}


def test_exit_and_signal_end_events(client: httpx.Client) -> None:
    end = start(client, "exit 4")[-2][1]["event"]["end"]
    assert end == {
        "exitCode": 4,
        "exited": True,
        "status": "exit status 4",
        "error": "exit status 4",
    }
    end = start(client, "kill -TERM $$")[-2][1]["event"]["end"]
    assert end == {"exitCode": -1, "status": "signal: terminated", "error": "signal: terminated"}


def test_keepalive_during_silence(client: httpx.Client) -> None:
    frames = start(client, "sleep 1.3; echo done", **{"Keepalive-Ping-Interval": "1"})
    events = [m.get("event", {}) for f, m in frames if f == 0]
    assert {"keepalive": {}} in events


def test_stream_error_before_start_is_an_end_stream_error(client: httpx.Client) -> None:
    req = {"process": {"cmd": "/bin/true", "cwd": "/no/such/dir"}}
    r = client.post("/process.Process/Start", content=envelope(req), headers=CONNECT_STREAM)
    if r.status_code == 200:
        (flags, body), *_ = parse_envelopes(r.content)
        assert flags == 2 and body["error"]["code"] == "invalid_argument"
    else:
        assert r.status_code == 400 and r.json()["code"] == "invalid_argument"


def test_unary_json_and_errors(client: httpx.Client) -> None:
    r = client.post(
        "/filesystem.Filesystem/Stat", json={"path": "/home/user"}, headers=CONNECT_UNARY
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    entry = r.json()["entry"]
    assert entry["type"] == "FILE_TYPE_DIRECTORY"
    assert entry["modifiedTime"].endswith("Z")
    assert entry["owner"] == "user" and entry["permissions"] == "drwxr-xr-x"
    r = client.post("/filesystem.Filesystem/Stat", json={"path": "/nope"}, headers=CONNECT_UNARY)
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = client.post(
        "/filesystem.Filesystem/RemoveWatcher", json={"watcherId": "x"}, headers=CONNECT_UNARY
    )
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    r = client.post("/filesystem.Filesystem/Stat", json={"path": "~other/x"}, headers=CONNECT_UNARY)
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
    r = client.post(
        "/process.Process/SendSignal",
        json={"process": {"pid": 1}, "signal": "SIGNAL_UNSPECIFIED"},
        headers=CONNECT_UNARY,
    )
    assert r.status_code in (400, 404)
    r = client.post("/process.Process/Nope", json={}, headers=CONNECT_UNARY)
    assert r.status_code == 404


def test_client_streaming_stream_input(client: httpx.Client) -> None:
    req = {"process": {"cmd": "/bin/cat"}, "stdin": True}
    with client.stream(
        "POST", "/process.Process/Start", content=envelope(req), headers=CONNECT_STREAM
    ) as resp:
        chunks = resp.iter_bytes()
        first = next(chunks)
        pid = parse_envelopes(first[: 5 + struct.unpack(">I", first[1:5])[0]])[0][1]["event"][
            "start"
        ]["pid"]

        def body():  # type: ignore[no-untyped-def]
            yield envelope({"start": {"process": {"pid": pid}}})
            yield envelope({"keepalive": {}})
            yield envelope({"data": {"input": {"stdin": base64.b64encode(b"streamed").decode()}}})

        r = client.post("/process.Process/StreamInput", content=body(), headers=CONNECT_STREAM)
        assert r.status_code == 200
        assert parse_envelopes(r.content) == [(0, {}), (2, {})]
        r = client.post(
            "/process.Process/CloseStdin", json={"process": {"pid": pid}}, headers=CONNECT_UNARY
        )
        assert r.status_code == 200 and r.json() == {}
        data = b"".join(chunks)
    out = b"".join(
        base64.b64decode(m["event"]["data"]["stdout"])
        for f, m in parse_envelopes(first[5 + struct.unpack(">I", first[1:5])[0] :] + data)
        if f == 0 and "data" in m.get("event", {})
    )
    assert out == b"streamed"


# --- access token ------------------------------------------------------------------------


def test_token_required_except_exemptions(agent_url: str, token: str) -> None:
    with httpx.Client(base_url=agent_url, timeout=10) as anon:
        r = anon.post("/process.Process/List", json={}, headers=CONNECT_UNARY)
        assert r.status_code == 401 and r.json()["code"] == 401
        r = anon.post(
            "/process.Process/List", json={}, headers={**CONNECT_UNARY, "X-Access-Token": "bad"}
        )
        assert r.status_code == 401
        assert anon.get("/health").status_code == 204
        assert anon.get("/envs").status_code == 401
        assert anon.get("/metrics").status_code == 401
        assert anon.get("/files", params={"path": "/etc/hostname"}).status_code == 401
        assert anon.post("/init", json={}).status_code == 204
        r = anon.get("/envs", headers={"X-Access-Token": token})
        assert r.status_code == 200 and r.json() == SANDBOX_ENV
        m = anon.get("/metrics", headers={"X-Access-Token": token}).json()
        assert set(m) == {
            "ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "disk_used", "disk_total"
        }  # fmt: skip
        assert m["mem_total"] > m["mem_used"] > 0


def test_sdk_with_a_wrong_token_is_rejected(stub) -> None:  # type: ignore[no-untyped-def]
    sbx = Sandbox.create(template="wrong-token")
    try:
        with pytest.raises(AuthenticationException):
            sbx.commands.run("true")
        with pytest.raises(AuthenticationException):
            sbx.files.list("/")
        with pytest.raises(AuthenticationException):
            sbx.files.read("/etc/hostname")
    finally:
        sbx.kill()


# --- signed URLs ------------------------------------------------------------------------------


def test_signed_download_and_upload_urls(sbx: Sandbox, workdir: str) -> None:
    path = f"/home/user/{workdir}/signed.txt"
    up = sbx.upload_url(path, use_signature_expiration=60)
    r = httpx.post(up, files={"file": ("signed.txt", b"via signed url")})
    assert r.status_code == 200, r.text
    assert r.json()[0]["path"] == path
    down = sbx.download_url(path)
    with urllib.request.urlopen(down, timeout=10) as resp:  # no headers at all
        assert resp.read() == b"via signed url"
    root_url = sbx.download_url("/etc/hostname", user="root", use_signature_expiration=30)
    assert httpx.get(root_url).status_code == 200
    tampered = down.replace("signature=v1_", "signature=v1_x")
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(tampered, timeout=10)
    assert ei.value.code == 401
    expired = sbx.download_url(path, use_signature_expiration=-10)
    assert httpx.get(expired).status_code == 401
    assert httpx.get(down, headers={"X-Access-Token": "wrong"}).status_code == 401


# --- /files details ---------------------------------------------------------------------------


def test_files_range_gzip_and_errors(client: httpx.Client, sbx: Sandbox, workdir: str) -> None:
    path = f"/home/user/{workdir}/r.txt"
    sbx.files.write(path, "0123456789")
    r = client.get("/files", params={"path": path}, headers={"Range": "bytes=2-5"})
    assert (r.status_code, r.content, r.headers["content-range"]) == (206, b"2345", "bytes 2-5/10")
    r = client.get("/files", params={"path": path}, headers={"Range": "bytes=-3"})
    assert r.content == b"789"
    r = client.get("/files", params={"path": path}, headers={"Range": "bytes=20-"})
    assert r.status_code == 416
    r = client.get("/files", params={"path": path})
    assert r.headers["content-disposition"] == 'inline; filename="r.txt"'
    raw = client.get("/files", params={"path": path}, headers={"Accept-Encoding": "gzip"})
    assert raw.headers.get("content-encoding") == "gzip" and raw.content == b"0123456789"
    r = client.get("/files", params={"path": f"{path}.missing"})
    assert r.status_code == 404 and r.json()["code"] == 404
    r = client.get("/files", params={"path": f"/home/user/{workdir}"})
    assert r.status_code == 400 and r.json()["code"] == 400
    r = client.get("/files", params={"path": path, "username": "nosuchuser"})
    assert r.status_code == 401
    r = client.post(
        "/files", params={"path": path}, content=b"x", headers={"Content-Type": "text/plain"}
    )
    assert r.status_code == 400
    r = client.post("/files", content=b"x", headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 400
    body = gzip.compress(b"zipped upload")
    r = client.post(
        "/files",
        params={"path": path},
        content=body,
        headers={"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"},
    )
    assert r.status_code == 200 and sbx.files.read(path) == "zipped upload"


def test_duplicate_multipart_targets_write_the_first(client: httpx.Client, workdir: str) -> None:
    target = f"{workdir}/dup.txt"
    r = client.post("/files", files=[("file", (target, b"first")), ("file", (target, b"second"))])
    assert r.status_code == 200 and len(r.json()) == 1
    assert client.get("/files", params={"path": target}).content == b"first"


def test_disk_full_is_507_and_agent_survives(sbx: Sandbox, client: httpx.Client) -> None:
    mnt = "/mnt/aenvt-small-" + uuid.uuid4().hex[:6]
    sbx.commands.run(
        f"mkdir -p {mnt} && mount -t tmpfs -o size=256k aenvt-small {mnt}", user="root"
    )
    try:
        r = client.post(
            "/files",
            params={"path": f"{mnt}/big", "username": "root"},
            content=b"x" * (1024 * 1024),
            headers={"Content-Type": "application/octet-stream"},
        )
        assert r.status_code == 507 and r.json()["code"] == 507
        assert client.get("/health").status_code == 204
    finally:
        sbx.commands.run(f"umount {mnt}; rmdir {mnt}", user="root")


def test_init_rejects_bad_entropy(agent_url: str) -> None:
    r = httpx.post(agent_url + "/init", json={"aenvEntropy": "not base64!"})
    assert r.status_code == 400


# --- robustness -------------------------------------------------------------------------------


def _agent_rss_kib(sbx: Sandbox) -> int:
    out = sbx.commands.run("grep VmRSS /proc/1/status", user="root").stdout
    return int(out.split()[1])


def test_unread_never_ending_output_keeps_agent_memory_bounded(
    sbx: Sandbox, client: httpx.Client, agent_url: str, token: str
) -> None:
    before = _agent_rss_kib(sbx)
    req = {"process": {"cmd": "/usr/bin/yes", "args": ["x" * 100]}, "stdin": False}
    # A raw socket that sends the request and never reads: the agent must stop reading the
    # process's output instead of buffering it.
    import socket

    host, port = agent_url.removeprefix("http://").split(":")
    body = envelope(req)
    s = socket.create_connection((host, int(port)))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(
        b"POST /process.Process/Start HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/connect+json\r\nConnect-Protocol-Version: 1\r\n"
        + f"X-Access-Token: {token}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    try:
        deadline = time.monotonic() + 30  # until it runs (a busy host starts it late)
        while not (procs := [p for p in sbx.commands.list() if p.cmd == "/usr/bin/yes"]):
            assert time.monotonic() < deadline, "the process never started"
            time.sleep(0.1)
        time.sleep(1.5)  # ... and has written for a while
        grown = _agent_rss_kib(sbx) - before
        assert grown < 64 * 1024, f"agent RSS grew by {grown} KiB"
        procs = [p for p in sbx.commands.list() if p.cmd == "/usr/bin/yes"]
        assert len(procs) == 1
    finally:
        s.close()
    # The client is gone; the process is not. Kill it through the SDK.
    assert sbx.commands.kill(procs[0].pid) is True
    assert client.get("/health").status_code == 204


def test_cannot_escape_root_with_dotdot(sbx: Sandbox) -> None:
    assert sbx.files.get_info("/../../../../").path == "/"
    expected = sbx.files.read("/etc/hostname")
    assert sbx.files.read("../../etc/../etc/hostname", user="root") == expected


def test_signature_helper_matches_sdk() -> None:
    from e2b.sandbox.signature import get_signature

    from aenv.guest.agent.signing import signature

    theirs = get_signature("/p", "read", None, "tok", None)["signature"]
    assert signature("/p", "read", "", "tok", None) == theirs
