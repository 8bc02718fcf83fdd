"""The RL plane's request bodies (`/rl/...`), validated by the API: a bad one is a 400."""

from __future__ import annotations

import base64
import binascii
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_MEMBERS = 256  # members pre-forked by one call


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class FileIn(Body):
    """A file to write: `content` (text) or `contentBase64` (bytes)."""

    path: str = Field(min_length=1, max_length=4096)
    content: str | None = None
    content_base64: str | None = Field(default=None, alias="contentBase64")

    @model_validator(mode="after")
    def _one(self) -> FileIn:
        if self.content is not None and self.content_base64 is not None:
            raise ValueError("give content or contentBase64, not both")
        if self.content_base64 is not None:
            try:
                base64.b64decode(self.content_base64, validate=True)
            except (binascii.Error, ValueError) as e:
                raise ValueError(f"{self.path}: contentBase64 is not base64") from e
        return self

    def data(self) -> bytes:
        if self.content_base64 is not None:
            return base64.b64decode(self.content_base64)
        return (self.content or "").encode()


class Command(Body):
    """A command for `bash -l -c`, as the sandbox's default user unless `user` says."""

    cmd: str = Field(min_length=1, max_length=1 << 16)
    timeout: float = Field(default=60, gt=0, le=24 * 3600)
    user: str | None = Field(default=None, max_length=64)
    cwd: str | None = Field(default=None, max_length=4096)
    envs: dict[str, str] = Field(default_factory=dict)


class Source(Body):
    """Where a group's start state comes from: exactly one of these."""

    sandbox: str | None = Field(default=None, description="a running or paused sandbox")
    snapshot: str | None = Field(default=None, description="a snapshot id or name")
    template: str | None = Field(default=None, description="a template id, alias or name:tag")
    image: str | None = Field(default=None, description="an image reference")

    @model_validator(mode="after")
    def _exactly_one(self) -> Source:
        given = [k for k in ("sandbox", "snapshot", "template", "image") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("source needs exactly one of sandbox, snapshot, template, image")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("sandbox", "snapshot", "template", "image") if getattr(self, k))

    @property
    def ref(self) -> str:
        return str(getattr(self, self.kind))


class Step(Body):
    """A setup command; `background`: started and left running (a server, a counter): the
    start state holds it, running, and so does every member."""

    cmd: str = Field(min_length=1, max_length=1 << 16)
    background: bool = False


class Setup(Body):
    """Run once, on one sandbox made from the source, before the start state is taken:
    the files are written first, then each command in order (a non-zero exit fails it)."""

    files: list[FileIn] = Field(default_factory=list, max_length=1000)
    commands: list[str | Step] = Field(default_factory=list, max_length=100)

    def steps(self) -> list[Step]:
        return [Step(cmd=c) if isinstance(c, str) else c for c in self.commands]
    user: str | None = Field(default=None, max_length=64)
    cwd: str | None = Field(default=None, max_length=4096)
    envs: dict[str, str] = Field(default_factory=dict)
    timeout: float = Field(default=1800, gt=0, le=24 * 3600, description="for all of it")


class GroupJoin(Body):
    key: str = Field(min_length=1, max_length=512, description="one per prompt or task")
    source: Source | None = Field(default=None, description="needed by the call that makes "
                                  "the group; later calls may omit it")  # fmt: skip
    setup: Setup | None = None
    n: int = Field(default=0, ge=0, le=MAX_MEMBERS, description="members forked ahead")
    lease_s: float | None = Field(default=None, description="a new lease for the group")
    lease_id: str | None = Field(default=None, alias="leaseID", description="an existing "
                                 "lease to hold the group")  # fmt: skip

    @model_validator(mode="after")
    def _lease(self) -> GroupJoin:
        if self.lease_s is not None and self.lease_id is not None:
            raise ValueError("give lease_s or leaseID, not both")
        return self


class LeaseNew(Body):
    lease_s: float


class LeaseSandbox(Body):
    sandbox_id: str = Field(alias="sandboxID", min_length=1)


class Evaluate(Command):
    """Run a verifier in a throwaway fork of `sandboxID` (`base: current`), or in a sandbox
    started from `snapshot` (`base: snapshot`: a pristine task state, e.g. a group's start)."""

    sandbox_id: str | None = Field(default=None, alias="sandboxID")
    base: Literal["current", "snapshot"] = "current"
    snapshot: str | None = None
    files: list[FileIn] = Field(default_factory=list, max_length=1000)
    reward_file: str = Field(default="/logs/verifier/reward.txt", min_length=1)
    timeout: float = Field(default=600, gt=0, le=24 * 3600)

    @model_validator(mode="after")
    def _base(self) -> Evaluate:
        if self.base == "current" and not self.sandbox_id:
            raise ValueError("base current needs sandboxID")
        if self.base == "snapshot" and not self.snapshot:
            raise ValueError("base snapshot needs snapshot")
        return self


class CheckpointNew(Body):
    lease_id: str | None = Field(default=None, alias="leaseID", description="a lease that "
                                 "keeps the checkpoint after its sandbox is gone")  # fmt: skip


class RollbackTo(Body):
    step_id: str = Field(alias="stepID", min_length=1)


class CheckpointFork(Body):
    count: int = Field(default=1, ge=1)
    lease_id: str | None = Field(default=None, alias="leaseID")
    timeout: int | None = Field(default=None, ge=0)
