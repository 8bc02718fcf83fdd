"""The trainer's side of aenv's RL plane: groups, leases, evaluations (docs/rl.md).

    rl = RL()                                   # E2B_API_URL, E2B_API_KEY
    with rl.lease(lease_s=60) as lease:         # renewed in the background
        m = lease.join("prompt-17", template="base", setup=Setup(commands=["make"]), n=8)
        sbx = m.sandbox()                       # an e2b.Sandbox (the unmodified SDK)
        sbx.commands.run("...")
        res = rl.evaluate(m.sandbox_id, "bash /tests/test.sh")
        res.reward                              # None unless status == "ok"

This module depends on httpx and e2b only (it ships in the `aenv-rl` distribution)."""

from __future__ import annotations

import atexit
import base64
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx

DEFAULT_LEASE_S = 300.0


class RLError(Exception):
    """The node refused a call: `status` and its `message`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass
class File:
    path: str
    data: bytes | str

    def to_json(self) -> dict[str, str]:
        if isinstance(self.data, str):
            return {"path": self.path, "content": self.data}
        return {"path": self.path, "contentBase64": base64.b64encode(self.data).decode()}


@dataclass
class Background:
    """A setup command started and left running (its members inherit it, running)."""

    cmd: str

    def to_json(self) -> dict[str, Any]:
        return {"cmd": self.cmd, "background": True}


@dataclass
class Setup:
    """Run once on a sandbox of the group's source; then its start state is taken."""

    commands: list[str | Background] = field(default_factory=list)
    files: list[File] = field(default_factory=list)
    user: str | None = None
    cwd: str | None = None
    envs: dict[str, str] = field(default_factory=dict)
    timeout: float = 1800

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "commands": [c if isinstance(c, str) else c.to_json() for c in self.commands],
            "files": [f.to_json() for f in self.files], "envs": self.envs,
            "timeout": self.timeout}
        return d | {k: v for k, v in (("user", self.user), ("cwd", self.cwd)) if v}


@dataclass(frozen=True)
class Evaluation:
    status: str  # ok | error | timeout | infra_error
    reward: float | None
    exit_code: int | None
    stdout: str
    stderr: str
    error: str | None
    duration_ms: float
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Evaluation:
        return cls(d["status"], d.get("reward"), d.get("exitCode"), d.get("stdout", ""),
                   d.get("stderr", ""), d.get("error"), d.get("durationMs", 0.0), d)


class RL:
    """A client of one node's (or gateway's) `/rl` API."""

    def __init__(self, api_url: str | None = None, api_key: str | None = None,
                 timeout: float = 3600.0) -> None:
        self.api_url = (api_url or os.environ.get("E2B_API_URL") or "").rstrip("/")
        if not self.api_url:
            raise ValueError("no API URL: pass api_url or set E2B_API_URL")
        self.api_key = api_key or os.environ.get("E2B_API_KEY")
        headers = {"X-API-Key": self.api_key} if self.api_key else {}
        self.http = httpx.Client(base_url=self.api_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, path: str, body: Any = None) -> Any:
        r = self.http.request(method, path, json=body)
        if r.status_code >= 400:
            try:
                msg = r.json().get("message") or r.text
            except ValueError:
                msg = r.text
            raise RLError(r.status_code, str(msg))
        return r.json() if r.content else None

    # -- leases ----------------------------------------------------------------------------

    def lease(self, lease_s: float = DEFAULT_LEASE_S, *, renew: bool = True) -> Lease:
        """A new lease; with `renew`, a background thread renews it every `lease_s`/3 until
        `close()` (which ends it and all it holds)."""
        return Lease(self, self.call("POST", "/rl/leases", {"lease_s": lease_s}), renew=renew)

    # -- groups ----------------------------------------------------------------------------

    def join(self, key: str, *, template: str | None = None, image: str | None = None,
             snapshot: str | None = None, sandbox: str | None = None,
             setup: Setup | None = None, n: int = 0, lease: Lease | None = None,
             lease_s: float | None = None) -> Member:  # fmt: skip
        """The next member of the group of `key` (the first call makes it from the one
        source given)."""
        body: dict[str, Any] = {"key": key, "n": n}
        src = {k: v for k, v in (("template", template), ("image", image),
                                 ("snapshot", snapshot), ("sandbox", sandbox)) if v}
        if src:
            body["source"] = src
        if setup is not None:
            body["setup"] = setup.to_json()
        if lease is not None:
            body["leaseID"] = lease.lease_id
        elif lease_s is not None:
            body["lease_s"] = lease_s
        d = self.call("POST", "/rl/groups", body)
        return Member(self, d["groupID"], d["member"]["sandboxID"], d["member"]["index"],
                      d["created"], d["lease"]["leaseID"], d["startSnapshotID"])

    def group(self, group_id: str) -> Group:
        return Group(self, group_id)

    # -- evaluate --------------------------------------------------------------------------

    def evaluate(self, sandbox_id: str | None, cmd: str, *, files: list[File] | None = None,
                 base: str = "current", snapshot: str | None = None,
                 reward_file: str = "/logs/verifier/reward.txt", timeout: float = 600,
                 user: str | None = None, cwd: str | None = None) -> Evaluation:  # fmt: skip
        """Run `cmd` in a throwaway fork of the sandbox (or a sandbox of `snapshot`, with
        `base="snapshot"`): the reward it wrote to `reward_file`, or why there is none."""
        body: dict[str, Any] = {"cmd": cmd, "base": base, "reward_file": reward_file,
                                "timeout": timeout,
                                "files": [f.to_json() for f in files or []]}  # fmt: skip
        for k, v in (("sandboxID", sandbox_id), ("snapshot", snapshot), ("user", user),
                     ("cwd", cwd)):  # fmt: skip
            if v:
                body[k] = v
        return Evaluation.from_json(self.call("POST", "/rl/evaluate", body))

    def reward(self, sandbox_id: str, cmd: str, *,
               reward_file: str = "/logs/verifier/reward.txt", timeout: float = 600,
               ) -> tuple[float, Evaluation]:  # fmt: skip
        """The grader's reward for the sandbox (`evaluate` in a throwaway fork): 0.0 when it
        gave none (`error`, `timeout`: the agent's doing). RLError (503) when the platform
        failed (`infra_error`): never scored, the trainer decides what to do with it."""
        res = self.evaluate(sandbox_id, cmd, reward_file=reward_file, timeout=timeout)
        if res.status == "infra_error":
            raise RLError(503, f"grading failed on the platform's side: {res.error}")
        return (float(res.reward) if res.reward is not None else 0.0), res

    # -- checkpoints and trees ------------------------------------------------------------

    def checkpoint(self, sandbox_id: str, *, lease: Lease | None = None) -> str:
        """A checkpoint of a running sandbox: its step id. A `lease` keeps it after the
        sandbox is gone (to fork from it)."""
        body = {"leaseID": lease.lease_id} if lease is not None else {}
        return self.call("POST", f"/rl/sandboxes/{sandbox_id}/checkpoints", body)["stepID"]

    def rollback(self, sandbox_id: str, step_id: str) -> dict[str, Any]:
        """The same sandbox (id, token) back in that checkpoint's state."""
        return self.call("POST", f"/rl/sandboxes/{sandbox_id}/rollback", {"stepID": step_id})

    def fork_checkpoint(self, step_id: str, count: int = 1, *,
                        lease: Lease | None = None) -> list[str]:  # fmt: skip
        """`count` new sandboxes in the checkpoint's state: their ids (RLError if any
        failed; those that started are then in the lease, or running)."""
        body: dict[str, Any] = {"count": count}
        if lease is not None:
            body["leaseID"] = lease.lease_id
        return _forked(self.call("POST", f"/rl/checkpoints/{step_id}/fork", body))

    def fork(self, sandbox_id: str, count: int = 1, *, timeout: int | None = None,
             lease: Lease | None = None) -> list[str]:  # fmt: skip
        """`count` copies of a running or paused sandbox (aenv's fork): their ids, held by
        `lease` if given (RLError if any failed)."""
        body: dict[str, Any] = {"count": count}
        if timeout is not None:
            body["timeout"] = timeout
        ids = _forked(self.call("POST", f"/sandboxes/{sandbox_id}/fork", body))
        for sid in ids if lease is not None else []:
            lease.hold(sid)
        return ids

    def lineage(self, some_id: str) -> dict[str, Any]:
        """The tree holding a checkpoint or a sandbox: `{root, nodes}`."""
        return self.call("GET", f"/rl/lineage/{some_id}")

    def delete_checkpoint(self, step_id: str) -> dict[str, Any]:
        """The checkpoint and its subtree (checkpoints, and live sandboxes under them)."""
        return self.call("DELETE", f"/rl/checkpoints/{step_id}")


def _forked(out: list[dict[str, Any]]) -> list[str]:
    """The ids in a fork's answer, or RLError for its first failed child."""
    errors = [r["error"] for r in out if "error" in r]
    if errors:
        raise RLError(errors[0]["code"], errors[0]["message"])
    return [r["sandbox"]["sandboxID"] for r in out]


_process_lock = threading.Lock()
_process_lease: Lease | None = None


def process_lease() -> Lease:
    """One lease for this process's groups and sandboxes (an adapter's: Harbor, SkyRL, verl,
    NeMo Gym), made at first use with `RL()` and `AENV_RL_LEASE_S` (default 600), renewed in
    the background, ended at exit. A killed process's lease lapses: what it held goes."""
    global _process_lease
    with _process_lock:
        if _process_lease is None:
            lease_s = float(os.environ.get("AENV_RL_LEASE_S")
                            or os.environ.get("AENV_HARBOR_LEASE_S") or 600)  # fmt: skip
            _process_lease = RL().lease(lease_s)
            atexit.register(_process_lease.close)
        return _process_lease


_BASH = re.compile(r"<bash>(.*?)</bash>|```(?:bash|sh)\n(.*?)```", re.S)
_SUBMIT = re.compile(r"<submit\s*/?>")


def command_of(text: str) -> str | None:
    """The command a model's text asks for: its last <bash>...</bash> (or ```bash fence);
    None (no command, or <submit/>) to end the episode. The adapters' convention."""
    if _SUBMIT.search(text):
        return None
    found = [a or b for a, b in _BASH.findall(text)]
    cmd = found[-1].strip() if found else ""
    return cmd or None


def command_output(sandbox: Any, cmd: str, timeout: float) -> tuple[str, int]:
    """What `cmd` printed (stdout, then stderr) and its exit code, in an e2b.Sandbox: a
    non-zero exit is an answer, not an error."""
    from e2b.sandbox.commands.command_handle import CommandExitException

    try:
        r = sandbox.commands.run(cmd, timeout=timeout)
        return r.stdout + r.stderr, r.exit_code
    except CommandExitException as e:
        return (e.stdout or "") + (e.stderr or ""), e.exit_code


class Lease:
    def __init__(self, rl: RL, d: dict[str, Any], *, renew: bool) -> None:
        self.rl = rl
        self.lease_id: str = d["leaseID"]
        self.lease_s: float = d["leaseS"]
        self._stop = threading.Event()
        self.renew_error: Exception | None = None  # the last failed renewal, if any
        self._thread: threading.Thread | None = None
        if renew:
            self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                            name=f"aenv-lease-{self.lease_id}")  # fmt: skip
            self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                self.renew()
                self.renew_error = None
            except Exception as e:  # a blip: the next round tries again, within the lease
                self.renew_error = e

    def renew(self) -> dict[str, Any]:
        return self.rl.call("POST", f"/rl/leases/{self.lease_id}")

    def hold(self, sandbox_id: str) -> None:
        """The lease holds a sandbox made otherwise (ended with the lease)."""
        self.rl.call("POST", f"/rl/leases/{self.lease_id}/sandboxes", {"sandboxID": sandbox_id})

    def join(self, key: str, **kw: Any) -> Member:
        return self.rl.join(key, lease=self, **kw)

    def close(self) -> None:
        """Stop renewing and end the lease and all it holds now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.rl.call("DELETE", f"/rl/leases/{self.lease_id}")
        except RLError as e:
            if e.status != 404:  # lapsed already: all it held is gone
                raise

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Member:
    rl: RL
    group_id: str
    sandbox_id: str
    index: int
    created_group: bool
    lease_id: str
    start_snapshot: str

    def sandbox(self, **opts: Any) -> Any:
        """The member as an `e2b.Sandbox` (connected through the E2B API)."""
        from e2b import Sandbox

        opts.setdefault("api_key", self.rl.api_key)
        opts.setdefault("api_url", self.rl.api_url)
        return Sandbox.connect(self.sandbox_id, **opts)

    @property
    def group(self) -> Group:
        return Group(self.rl, self.group_id)


@dataclass(frozen=True)
class Group:
    rl: RL
    group_id: str

    def info(self) -> dict[str, Any]:
        return self.rl.call("GET", f"/rl/groups/{self.group_id}")

    def exec(self, cmd: str, *, timeout: float = 60, user: str | None = None,
             cwd: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
        body: dict[str, Any] = {"cmd": cmd, "timeout": timeout}
        body |= {k: v for k, v in (("user", user), ("cwd", cwd)) if v}
        return self.rl.call("POST", f"/rl/groups/{self.group_id}/exec", body)

    def pause(self) -> list[dict[str, Any]]:
        return self.rl.call("POST", f"/rl/groups/{self.group_id}/pause")

    def resume(self) -> list[dict[str, Any]]:
        return self.rl.call("POST", f"/rl/groups/{self.group_id}/resume")

    def replace_failed(self) -> dict[str, Any]:
        return self.rl.call("POST", f"/rl/groups/{self.group_id}/replace_failed")

    def end(self) -> None:
        self.rl.call("DELETE", f"/rl/groups/{self.group_id}")
