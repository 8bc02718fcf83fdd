"""Reward in a throwaway fork: the verifier runs in a copy of the sandbox (or of a pristine
task snapshot), never in the sandbox itself, and a platform failure is `infra_error`, never
a reward of 0 (a dead sandbox scored "failed" poisons a trainer's gradient)."""

from __future__ import annotations

import contextlib
import logging
import math
import time

from aenv.obs import RL_OPS, log_event
from aenv.orchestrator.errors import CapacityExhausted, NotFound
from aenv.orchestrator.store import SandboxRecord
from aenv.rl.server.groups import Groups
from aenv.rl.server.guest import FileSpec, GuestGone
from aenv.rl.server.leases import TIMEOUT_MARGIN_S
from aenv.rl.server.models import Evaluate

log = logging.getLogger("aenv.rl")
REWARD_MAX_BYTES = 4096


def parse_reward(raw: bytes | None, path: str) -> tuple[float | None, str | None]:
    """(reward, None), or (None, why there is none)."""
    if raw is None:
        return None, f"the verifier wrote no {path}"
    text = raw.decode(errors="replace").strip()
    try:
        value = float(text)
    except ValueError:
        return None, f"{path} holds no number: {text[:80]!r}"
    if not math.isfinite(value):
        return None, f"{path} holds {text[:80]!r}, not a finite number"
    return value, None


class Evaluator:
    def __init__(self, groups: Groups) -> None:
        self.groups = groups
        self.orch = groups.orch

    async def evaluate(self, team_id: str, body: Evaluate) -> dict[str, object]:
        t0 = time.monotonic()
        ttl = int(body.timeout + TIMEOUT_MARGIN_S)
        child = await self._fork(team_id, body, ttl)
        fork_s = time.monotonic() - t0
        out: dict[str, object] = {"forkMs": round(fork_s * 1e3, 1)}
        if isinstance(child, str):
            out |= {"status": "infra_error", "error": child}
        else:
            out["sandboxID"] = child.sandbox_id
            try:
                out |= await self._run(child, body)
            finally:
                with contextlib.suppress(NotFound):
                    await self.orch.kill(child.sandbox_id)
        out["durationMs"] = round((time.monotonic() - t0) * 1000, 1)
        RL_OPS.labels("evaluate", str(out["status"])).inc()
        log_event(log, "rl.evaluated", source=body.sandbox_id or body.snapshot,
                  status=out["status"], reward=out.get("reward"), ms=out["durationMs"])
        return out

    async def _fork(self, team_id: str, body: Evaluate, ttl: int) -> SandboxRecord | str:
        """The copy to run the verifier in, or why the platform could not make it."""
        if body.base == "current":
            assert body.sandbox_id is not None
            self.groups.sandbox_of(body.sandbox_id, team_id)
            got = await self.orch.fork(body.sandbox_id, 1, ttl)
        else:
            assert body.snapshot is not None
            got = await self.orch.fork_snapshot(body.snapshot, 1, ttl, team_id)
        r = got[0]
        if isinstance(r, CapacityExhausted):
            raise r  # 429: the caller tries again later
        if isinstance(r, BaseException):  # the copy did not start: the platform's failure
            return f"the evaluation sandbox did not start: {r}"
        assert isinstance(r, SandboxRecord)
        return r

    async def _run(self, child: SandboxRecord, body: Evaluate) -> dict[str, object]:
        route = self.orch.routes.get(child.sandbox_id)
        if route is None:
            return {"status": "infra_error", "error": "the evaluation sandbox is not running"}
        user = body.user or "root"  # a grader reads and writes what it needs
        try:
            async with self.groups.guest(route, user) as guest:
                await guest.write([FileSpec(f.path, f.data()) for f in body.files])
                try:
                    r = await guest.run(body.cmd, timeout_s=body.timeout,
                                        cwd=body.cwd or child.default_workdir, env=body.envs)
                except TimeoutError:
                    return {"status": "timeout",
                            "error": f"the verifier ran past its timeout ({body.timeout:g} s)"}
                raw = await guest.read(body.reward_file, REWARD_MAX_BYTES)
        except GuestGone as e:
            if self.orch.runtime.is_running(child.sandbox_id):  # the command killed its agent
                return {"status": "error", "error": f"{e} (its VM runs: the command may have "
                                                    "ended the sandbox's agent)"}
            return {"status": "infra_error", "error": str(e)}
        except Exception as e:  # the agent refused a file or the command (the caller's)
            return {"status": "error", "error": str(e) or type(e).__name__}
        res: dict[str, object] = {"exitCode": r.exit_code, "stdout": r.stdout,
                                  "stderr": r.stderr, "truncated": r.truncated,
                                  "commandMs": round(r.duration_s * 1000, 1)}  # fmt: skip
        reward, why = parse_reward(raw, body.reward_file)
        if reward is None:
            return res | {"status": "error", "error": why}
        return res | {"status": "ok", "reward": reward}

