"""A template build as the E2B SDK sends it (`POST /v2/templates/{id}/builds/{buildID}`,
TemplateBuildStartV2): the base, the steps, and the start and ready commands; and the step
cache's keys, a chain of hashes so a build reuses the longest prefix an earlier one ran."""

from __future__ import annotations

import hashlib
import json
import posixpath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

STEP_TYPES = ("RUN", "COPY", "ENV", "WORKDIR", "USER")
MAX_STEPS = 1000
HASH_RE = r"^[a-f0-9]{64}$"


class StepError(ValueError):
    pass


class Step(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    args: list[str] = Field(default_factory=list, max_length=10000)
    force: bool = False
    filesHash: str | None = Field(None, pattern=HASH_RE)
    forceUpload: bool = False

    @field_validator("type")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in STEP_TYPES:
            raise ValueError(f"unknown step type {v!r} (known: {', '.join(STEP_TYPES)})")
        return v

    def check(self, index: int) -> None:
        """The args each type needs, as the SDK lays them out."""
        n = len(self.args)
        need = {"RUN": (1, 2), "COPY": (2, 4), "WORKDIR": (1, 1), "USER": (1, 1)}
        if self.type == "ENV":
            if n % 2:
                raise StepError(f"step {index} (ENV): args must be KEY, VALUE pairs")
            return
        lo, hi = need[self.type]
        if not lo <= n <= hi or not self.args[0]:
            raise StepError(f"step {index} ({self.type}): expected {lo} to {hi} args, got {n}")
        if self.type == "COPY":
            if self.filesHash is None:
                raise StepError(f"step {index} (COPY): filesHash is missing")
            src = self.args[0]
            if src.startswith("/") or ".." in src.split("/"):
                raise StepError(f"step {index} (COPY): source {src!r} leaves the build context")
            mode = self.args[3] if n > 3 else ""
            if mode and not (mode.isdigit() and set(mode) <= set("01234567")):
                raise StepError(f"step {index} (COPY): mode {mode!r} is not octal")


class RegistryAuth(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["registry", "aws", "gcp"]
    username: str | None = None
    password: str | None = None


class BuildSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")

    fromImage: str | None = None
    fromTemplate: str | None = None
    fromImageRegistry: RegistryAuth | None = None
    force: bool = False
    steps: list[Step] = Field(default_factory=list, max_length=MAX_STEPS)
    startCmd: str | None = None
    readyCmd: str | None = None

    def check(self) -> None:
        if not self.fromImage and not self.fromTemplate:
            raise StepError("a build needs fromImage or fromTemplate")
        if self.fromImage and self.fromTemplate:
            raise StepError("fromImage and fromTemplate exclude each other")
        if self.fromImageRegistry is not None and self.fromImageRegistry.type != "registry":
            raise StepError(f"fromImageRegistry type {self.fromImageRegistry.type!r} is not "
                            "supported here (only 'registry', with username and password)")
        for i, step in enumerate(self.steps, 1):
            step.check(i)


def chain(previous: str, step: Step) -> str:
    """The cache key after `step`, given the key before it."""
    body = json.dumps({"type": step.type, "args": step.args, "files": step.filesHash},
                      sort_keys=True)  # fmt: skip
    return hashlib.sha256(f"{previous}\n{body}".encode()).hexdigest()


def base_key(base: str) -> str:
    return hashlib.sha256(f"base\n{base}".encode()).hexdigest()


def resolve(path: str, workdir: str) -> str:
    """A step's path, relative ones against the current workdir."""
    return posixpath.normpath(posixpath.join(workdir, path)) + ("/" if path.endswith("/") else "")
