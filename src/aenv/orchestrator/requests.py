"""What a create asks for, and how sandbox ids, tokens and a guest's /init are made."""

from __future__ import annotations

import secrets
import string
from dataclasses import dataclass, field
from pathlib import Path

from aenv.machines.api import AgentInit, VolumeMount
from aenv.orchestrator.store import SandboxRecord
from aenv.teams.model import DEFAULT_TEAM

ID_ALPHABET = string.ascii_lowercase + string.digits
ID_LENGTH = 20
# How long a create that hit max_sandboxes is told to wait: VMs go away at TTL or kill.
FULL_RETRY_AFTER_S = 5
# How long a create that hit max_concurrent_boots is told to wait: about one boot.
BOOTS_RETRY_AFTER_S = 1
# E2B's cap on one /refreshes call.
MAX_REFRESH_S = 3600
# The SDK's range for one fork call.
MAX_FORK_COUNT = 20
# An auto-pause at endAt that failed is tried again this much later (the sandbox keeps running).
AUTO_PAUSE_RETRY_S = 30
# envdVersion of a sandbox restored from a snapshot whose template is gone.
FALLBACK_ENVD_VERSION = "0.6.4"


def new_sandbox_id() -> str:
    return "".join(secrets.choice(ID_ALPHABET) for _ in range(ID_LENGTH))


def new_access_token() -> str:
    return secrets.token_hex(24)


def agent_init(rec: SandboxRecord, volumes_dir: Path) -> AgentInit:
    """What every start of `rec` (create, resume, fork child) sets up around its guest."""
    return AgentInit(access_token=rec.access_token, env_vars=dict(rec.env_vars),
                     default_user=rec.default_user or "user",
                     default_workdir=rec.default_workdir,
                     egress=rec.egress.owned_by(rec.team_id),
                     volumes=[VolumeMount(name=n, path=p, host_dir=volumes_dir / vid)
                              for n, p, vid in rec.volume_mounts])  # fmt: skip


@dataclass
class CreateRequest:
    """What a create asks for, already validated for types by the API."""

    template: str
    timeout_s: int
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    secure: bool = True
    auto_pause: bool = False
    auto_resume: bool = False
    auto_pause_memory: bool = True  # False: the TTL auto-pause is filesystem-only
    allow_internet: bool | None = None
    allow_out: list[object] = field(default_factory=list)  # E2B network.allowOut
    deny_out: list[object] = field(default_factory=list)  # E2B network.denyOut
    dns_servers: list[object] | None = None  # E2B network.dnsServers
    egress_proxy: object | None = None  # E2B network.egressProxy (network/socks.py)
    rules: object | None = None  # E2B network.rules (network/transforms.py)
    allow_public_traffic: bool | None = None  # E2B network.allowPublicTraffic (None: true)
    mask_request_host: str | None = None  # E2B network.maskRequestHost
    https_ports: list[object] | None = None  # E2B network.httpsPorts
    vcpus: int | None = None
    memory_mib: int | None = None
    # Chosen by a cluster gateway (which bound it to this node before asking); else new.
    sandbox_id: str | None = None
    existing_only: bool = False  # with sandbox_id: the sandbox it made, or 409 if gone
    volume_mounts: list[object] = field(default_factory=list)  # E2B volumeMounts
    team_id: str = DEFAULT_TEAM  # who asks: owns the sandbox, within its limits
