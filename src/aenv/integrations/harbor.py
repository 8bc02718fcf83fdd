"""Harbor 0.26 on aenv with one start state per task: every trial is a fork of it.

    environment:
      import_path: aenv.integrations.harbor:AenvEnvironment

It is Harbor's own E2B environment (template builds, uploads, exec, stop: all unchanged),
except that a trial's sandbox is the next member of the group of its template reference:
the first trial of a task makes the group's start state (a sandbox of the template,
snapshotted), every trial after it, in this process or another on the same node, is a fork
of that state. The groups live under one lease per process, renewed in the background and
ended at exit (a killed process's lease lapses: its start states go).

Needs `harbor` (Python 3.12) and this package's client; E2B_API_URL and E2B_API_KEY as for
Harbor's own E2B environment."""

from __future__ import annotations

import asyncio

from e2b import AsyncSandbox
from e2b.exceptions import RateLimitException, SandboxException
from harbor.environments.e2b import E2BEnvironment

from aenv.rl.client import RLError, process_lease


def _as_e2b(e: RLError) -> Exception:
    """The E2B SDK's exception for the node's answer, which Harbor's retries read (a build
    not ready yet is a 404 "does not exist"; a full node a 429)."""
    if e.status == 429:
        return RateLimitException(e.message)
    return SandboxException(f"{e.status}: {e.message}", status_code=e.status)


class AenvEnvironment(E2BEnvironment):
    async def _create_sandbox(self) -> None:
        lease = process_lease()
        try:
            member = await asyncio.to_thread(lease.join, f"harbor:{self.template_ref}",
                                             template=self.template_ref)  # fmt: skip
        except RLError as e:
            raise _as_e2b(e) from e
        self._sandbox = await AsyncSandbox.connect(member.sandbox_id,
                                                   api_key=lease.rl.api_key,
                                                   api_url=lease.rl.api_url)  # fmt: skip
