"""SandboxFusion's `run_code`, so a trainer's `reward.sandbox_fusion.url` (verl) points at
aenv unchanged: `POST /rl/run_code/{token}` with SandboxFusion's body, SandboxFusion's answer.

Each call runs in its own fork of the team's run-code start state (the node's default
template, snapshotted once), killed after the call: nothing one program leaves reaches the
next. verl's client sends no API key, so the token in the path is the credential: bound to
the API key that asked for it (revoking the key revokes it), signed with the node's secrets
key (the same on every node of a cluster), never logged. The answer is always HTTP 200 as
SandboxFusion's is: `Success`, `Failed` (the program's fault: an exit code, a time limit, a
compile error) or `SandboxError` (the platform's: the program never ran to an answer)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import logging
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aenv.obs import RL_OPS, log_event
from aenv.orchestrator.errors import CapacityExhausted, NotFound
from aenv.rl.server.groups import Groups, Member
from aenv.rl.server.guest import CommandResult, FileSpec, Guest, GuestGone
from aenv.rl.server.leases import Lease, Leases
from aenv.rl.server.models import GroupJoin, Source

log = logging.getLogger("aenv.rl")
TOKEN_PREFIX = "sf1."
GROUP_KEY = "aenv/run_code"  # the `aenv/` key prefix is the node's own (api/rl.py)
IDLE_LEASE_S = 900.0  # a team's run-code group goes this long after its last call
PREFORK = 2
WORKDIR = "/tmp/sandbox-fusion"
FETCH_MAX_BYTES = 8 << 20


@dataclass(frozen=True)
class Language:
    source: str  # the file the code goes to
    run: str
    compile: str | None = None
    memory_limit: bool = True  # ulimit -v (V8 reserves far more address space than it uses)


# What the node's `base` template has (Python, Node.js, a C/C++ toolchain, bash).
LANGUAGES = {
    "python": Language("main.py", "python3 main.py"),
    "bash": Language("main.sh", "bash main.sh"),
    "nodejs": Language("main.js", "node main.js", memory_limit=False),
    "cpp": Language("main.cpp", "./main", "g++ -O2 -std=c++17 -o main main.cpp"),
}


class RunCodeRequest(BaseModel):
    """SandboxFusion's body, as verl sends it (keys SandboxFusion knows and aenv does not,
    such as `compile_result`, are ignored)."""

    model_config = ConfigDict(extra="ignore")

    code: str = Field(max_length=1 << 20)
    language: str = "python"
    compile_timeout: float = Field(default=10, gt=0, le=600)
    run_timeout: float = Field(default=10, gt=0, le=3600)
    stdin: str | None = Field(default=None, max_length=16 << 20)
    memory_limit_MB: int = Field(default=-1, ge=-1)  # SandboxFusion's name
    files: dict[str, str | None] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list, max_length=100)


def answer(status: str, message: str = "", *, compile_result: dict[str, Any] | None = None,
           run_result: dict[str, Any] | None = None,
           files: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    return {"status": status, "message": message, "compile_result": compile_result,
            "run_result": run_result, "executor_pod_name": None, "files": files or {}}


def _result(status: str, r: CommandResult | None, elapsed: float) -> dict[str, Any]:
    return {"status": status, "execution_time": round(elapsed, 4),
            "return_code": None if r is None else r.exit_code,
            "stdout": "" if r is None else r.stdout, "stderr": "" if r is None else r.stderr}


class Tokens:
    """Run-code tokens: `sf1.<key id>.<mac>`, the mac an HMAC of the key id."""

    def __init__(self, secret: Callable[[], bytes]) -> None:
        self._secret = secret  # the node's secrets key, once the node has started

    def _mac(self, key_id: str) -> str:
        secret = self._secret()
        if not secret:
            raise RuntimeError("the node has not started: no secrets key yet")
        k = hashlib.sha256(b"aenv run_code token v1\0" + secret).digest()
        return hmac.new(k, key_id.encode(), hashlib.sha256).hexdigest()[:40]

    def make(self, key_id: str) -> str:
        return f"{TOKEN_PREFIX}{key_id}.{self._mac(key_id)}"

    def key_id(self, token: str) -> str | None:
        """The API key id the token was made for, or None for a token this node did not
        make."""
        if not token.startswith(TOKEN_PREFIX):
            return None
        key_id, _, mac = token[len(TOKEN_PREFIX):].rpartition(".")
        if not key_id or not hmac.compare_digest(mac, self._mac(key_id)):
            return None
        return key_id


class RunCode:
    def __init__(self, groups: Groups, leases: Leases, renew: Callable[[str, str], Lease],
                 template: Callable[[], str]) -> None:  # fmt: skip
        self.groups = groups
        self.leases = leases
        self.renew = renew  # RL.renew: the lease, and its members' timeouts, pushed on
        self.template = template
        self._lease_of: dict[str, str] = {}  # team -> its run-code lease

    def lease_id(self, team_id: str) -> str | None:
        """The lease holding the team's run-code group (released to end it now)."""
        return self._lease_of.get(team_id)

    def _lease(self, team_id: str) -> Lease:
        lid = self._lease_of.get(team_id)
        if lid is not None:
            with contextlib.suppress(NotFound):  # lapsed: its group went with it
                return self.renew(lid, team_id)
        lease = self.leases.new(team_id, IDLE_LEASE_S)
        self._lease_of[team_id] = lease.lease_id
        return lease

    async def run(self, team_id: str, raw: object) -> dict[str, Any]:
        """SandboxFusion's answer to `raw` (never raises but CapacityExhausted)."""
        t0 = time.monotonic()
        out = await self._answer(team_id, raw)
        RL_OPS.labels("run_code", out["status"]).inc()
        log_event(log, "rl.run_code", team_id=team_id, status=out["status"],
                  language=raw.get("language") if isinstance(raw, dict) else None,
                  ms=round((time.monotonic() - t0) * 1000, 1))  # fmt: skip
        return out

    async def _answer(self, team_id: str, raw: object) -> dict[str, Any]:
        try:
            req = RunCodeRequest.model_validate(raw)
        except ValidationError as e:
            return answer("SandboxError", "bad request: " + "; ".join(
                f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()))
        lang = LANGUAGES.get(req.language)
        if lang is None:
            return answer("SandboxError", f"language {req.language!r} is not supported here "
                          f"(one of {', '.join(LANGUAGES)})")  # fmt: skip
        try:
            files = _files(req, lang)
        except ValueError as e:
            return answer("SandboxError", str(e))
        lease = self._lease(team_id)
        body = GroupJoin(key=GROUP_KEY, source=Source(template=self.template()), n=PREFORK,
                         leaseID=lease.lease_id)  # fmt: skip
        try:
            g, m, _ = await self.groups.join(team_id, body)
        except CapacityExhausted:
            raise
        except Exception as e:  # no start state, no fork: the program never ran
            return answer("SandboxError", f"no sandbox to run in: {e}")
        try:
            return await self._in(m, req, lang, files)
        finally:
            await self.groups.discard(g, m)

    async def _in(self, m: Member, req: RunCodeRequest, lang: Language,
                  files: list[FileSpec]) -> dict[str, Any]:  # fmt: skip
        route = self.groups.orch.routes.get(m.sandbox_id)
        if route is None:
            return answer("SandboxError", "the sandbox is not running")
        try:
            async with self.groups.guest(route, "user") as guest:
                await guest.write(files)
                compiled = None
                if lang.compile is not None:
                    status, compiled = await _step(guest, lang.compile, req.compile_timeout)
                    if status != "Finished":
                        return answer("Failed", compile_result=compiled)
                limit = (f"ulimit -v {req.memory_limit_MB * 1024} && "
                         if req.memory_limit_MB > 0 and lang.memory_limit else "")  # fmt: skip
                stdin = "/dev/null" if req.stdin is None else ".stdin"
                status, ran = await _step(guest, f"{limit}{lang.run} < {stdin}",
                                          req.run_timeout)  # fmt: skip
                fetched = {p: base64.b64encode(data).decode() for p in req.fetch_files
                           if (data := await guest.read(_path(p), FETCH_MAX_BYTES)) is not None}
        except GuestGone as e:
            return answer("SandboxError", str(e))
        except Exception as e:  # the agent refused a file (a path it may not write)
            return answer("SandboxError", str(e) or type(e).__name__)
        return answer("Success" if status == "Finished" else "Failed",
                      compile_result=compiled, run_result=ran, files=fetched)


async def _step(guest: Guest, cmd: str, timeout_s: float) -> tuple[str, dict[str, Any]]:
    """Run one step in the work directory: (Finished | Error | TimeLimitExceeded, result)."""
    t0 = time.monotonic()
    try:
        r = await guest.run(cmd, timeout_s=timeout_s, cwd=WORKDIR)
    except TimeoutError:
        return "TimeLimitExceeded", _result("TimeLimitExceeded", None, time.monotonic() - t0)
    status = "Finished" if r.exit_code == 0 else "Error"
    return status, _result(status, r, r.duration_s)


def _path(p: str) -> str:
    return p if p.startswith("/") else posixpath.join(WORKDIR, p)


def _files(req: RunCodeRequest, lang: Language) -> list[FileSpec]:
    """The program, its stdin and its `files` (base64, paths relative to the work
    directory); ValueError for one that is not base64."""
    out = [FileSpec(_path(lang.source), req.code.encode())]
    if req.stdin is not None:
        out.append(FileSpec(_path(".stdin"), req.stdin.encode()))
    for p, content in req.files.items():
        try:
            data = base64.b64decode(content or "", validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"files[{p!r}] is not base64") from None
        out.append(FileSpec(_path(p), data))
    return out
