"""A NeMo Gym sandbox provider on aenv: `aenv` in the `nemo_gym.sandbox_providers` entry-point
group (this distribution publishes it), for nemo-gym 0.7.0's `SandboxProvider` protocol
(`nemo_gym/sandbox/providers/base.py`) with its optional pause/resume and connect.

    sandbox:
      aenv:                        # AenvProvider(**this mapping)
        template: base             # when a spec names no image
        lease_s: 600               # what the process made ends this long after it dies

A spec's `provider_options` choose where a sandbox comes from:

- `fork_from: <sandbox id>`: a fork of that sandbox (running or paused), e.g. the verifier's
  sandbox as a copy of the agent's, so grading starts where the agent stopped, without a
  boot or a replay, and cannot touch the agent's own state;
- `group: <key>`: the next member of the group of `key` (its first call makes the start
  state from `spec.image` or `template`): the samples of one task share it;
- neither: a new sandbox of `spec.image` or `template`.

Every sandbox is held by the process's lease (AENV_RL_LEASE_S), so a trainer that dies
leaves none behind. nemo-gym needs Python >= 3.13.14: its types are used when it is
installed, and otherwise stand-ins of the same fields (pinned from 0.7.0) are."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from e2b import AsyncSandbox, CommandExitException
from e2b.exceptions import NotFoundException, SandboxException

from aenv.rl.client import RL, Lease, RLError, process_lease

try:  # nemo-gym's own types where it is installed
    from nemo_gym.sandbox.providers.base import (  # type: ignore[import-not-found]
        SandboxExecResult,
        SandboxHandle,
        SandboxStatus,
    )
except ImportError:

    class SandboxStatus(str, Enum):  # type: ignore[no-redef]
        STARTING = "starting"
        RUNNING = "running"
        PAUSED = "paused"
        STOPPED = "stopped"
        ERROR = "error"
        UNKNOWN = "unknown"

    @dataclass
    class SandboxHandle:  # type: ignore[no-redef]
        sandbox_id: str
        provider_name: str
        raw: Any

    @dataclass(frozen=True)
    class SandboxExecResult:  # type: ignore[no-redef]
        stdout: str | None
        stderr: str | None
        return_code: int
        error_type: str | None = None


NAME = "aenv"
ERROR_RC = 125  # nemo-gym's providers' code for "the command did not run" (with error_type)


class AenvProvider:
    name = NAME

    def __init__(self, *, template: str = "base", lease_s: float | None = None,
                 api_url: str | None = None, api_key: str | None = None,
                 default_timeout_s: float = 180.0) -> None:  # fmt: skip
        self.template = template
        self.default_timeout_s = default_timeout_s
        self._explicit = api_url is not None or api_key is not None or lease_s is not None
        self._rl_args = (api_url, api_key, lease_s)
        self._lease: Lease | None = None

    @property
    def lease(self) -> Lease:
        if self._lease is None:
            url, key, lease_s = self._rl_args
            self._lease = (RL(url, key).lease(lease_s or 600) if self._explicit
                           else process_lease())  # fmt: skip
        return self._lease

    def _opts(self) -> dict[str, Any]:
        rl = self.lease.rl
        return {"api_key": rl.api_key, "api_url": rl.api_url}

    # -- the protocol ----------------------------------------------------------------------

    async def create(self, spec: Any) -> SandboxHandle:
        opts = dict(getattr(spec, "provider_options", None) or {})
        source = spec.image or self.template
        ttl = int(spec.ttl_s) if spec.ttl_s else None
        try:
            if fork_from := opts.get("fork_from"):
                (sid,) = await asyncio.to_thread(self.lease.rl.fork, str(fork_from), 1,
                                                 timeout=ttl, lease=self.lease)  # fmt: skip
            elif key := opts.get("group"):
                sid = (await asyncio.to_thread(self.lease.join, str(key),
                                               template=source)).sandbox_id  # fmt: skip
            else:
                sbx = await AsyncSandbox.create(source, timeout=ttl, envs=dict(spec.env),
                                                metadata=dict(spec.metadata),
                                                **self._opts())  # fmt: skip
                await asyncio.to_thread(self.lease.hold, sbx.sandbox_id)
                return SandboxHandle(sbx.sandbox_id, NAME, sbx)
        except RLError as e:
            raise SandboxException(f"{e.status}: {e.message}") from e
        return SandboxHandle(sid, NAME, await AsyncSandbox.connect(sid, **self._opts()))

    async def exec(self, handle: SandboxHandle, command: str, *, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout_s: float | None = None,
                   user: str | int | None = None) -> SandboxExecResult:  # fmt: skip
        sbx: AsyncSandbox = handle.raw
        kw: dict[str, Any] = {"cwd": cwd, "envs": env,
                              "timeout": timeout_s or self.default_timeout_s}  # fmt: skip
        if isinstance(user, str):
            kw["user"] = user
        try:
            r = await sbx.commands.run(command, **kw)
        except CommandExitException as e:
            return SandboxExecResult(e.stdout, e.stderr, e.exit_code)
        except TimeoutError as e:
            return SandboxExecResult("", str(e), ERROR_RC, "timeout")
        except SandboxException as e:
            return SandboxExecResult("", str(e), ERROR_RC, type(e).__name__)
        return SandboxExecResult(r.stdout, r.stderr, r.exit_code)

    async def upload_file(self, handle: SandboxHandle, source_path: Path,
                          target_path: str) -> None:  # fmt: skip
        data = await asyncio.to_thread(Path(source_path).read_bytes)
        await handle.raw.files.write(target_path, data)

    async def download_file(self, handle: SandboxHandle, source_path: str,
                            target_path: Path) -> None:  # fmt: skip
        data = await handle.raw.files.read(source_path, format="bytes")
        await asyncio.to_thread(Path(target_path).write_bytes, bytes(data))

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        try:
            info = await AsyncSandbox.get_info(handle.sandbox_id, **self._opts())
        except NotFoundException:
            return SandboxStatus.STOPPED
        except SandboxException:
            return SandboxStatus.UNKNOWN
        return SandboxStatus.PAUSED if info.state == "paused" else SandboxStatus.RUNNING

    async def close(self, handle: SandboxHandle) -> None:
        with contextlib.suppress(NotFoundException):  # gone already: closed
            await AsyncSandbox.kill(handle.sandbox_id, **self._opts())

    async def aclose(self) -> None:
        """An explicit lease (api_url, api_key or lease_s given) ends here, and with it what
        this provider made; the process lease ends at exit."""
        if self._lease is not None and self._explicit:
            await asyncio.to_thread(self._lease.close)
        self._lease = None

    # -- optional capabilities: pause and resume, connect ----------------------------------

    async def pause(self, handle: SandboxHandle) -> None:
        await handle.raw.beta_pause()

    async def resume(self, handle: SandboxHandle) -> None:
        handle.raw = await AsyncSandbox.connect(handle.sandbox_id, **self._opts())

    async def serialize_handle(self, handle: SandboxHandle, *,
                               scope: str | None = None) -> dict[str, Any]:  # fmt: skip
        return {"provider": NAME, "sandbox_id": handle.sandbox_id}

    async def connect(self, descriptor: Any) -> SandboxHandle:
        sid = str(descriptor["sandbox_id"])
        return SandboxHandle(sid, NAME, await AsyncSandbox.connect(sid, **self._opts()))
