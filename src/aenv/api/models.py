"""E2B wire models: request bodies (strictly typed) and response bodies (JSON keys as E2B's).

Field names are the JSON keys, camelCase as in E2B's OpenAPI spec. Unknown request keys are
ignored; wrong types are a 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

Seconds = Annotated[StrictInt, Field(ge=0)]
StrMap = dict[StrictStr, StrictStr]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AutoResume(_Body):
    enabled: StrictBool = False


class _Egress(_Body):
    model_config = ConfigDict(extra="allow")  # what is set of the rest is a 400

    allowOut: list[StrictStr] | None = None
    denyOut: list[StrictStr] | None = None
    dnsServers: list[StrictStr] | None = None
    egressProxy: dict[str, Any] | None = None  # checked in network/socks.py
    rules: dict[str, Any] | None = None  # checked in network/transforms.py


class SandboxNetwork(_Egress):
    """E2B's `SandboxNetworkConfig`. allowOut/denyOut (IPv4 addresses and CIDRs) are
    enforced per sandbox (docs/security.md, "Egress"); dnsServers are kept; the rest says
    how its ports are reached (`orchestrator/routes.Ingress`). Any other key set is a 400."""

    allowPublicTraffic: StrictBool | None = None
    maskRequestHost: StrictStr | None = None
    httpsPorts: list[StrictInt] | None = None


class SandboxNetworkUpdate(_Egress):
    """E2B's `SandboxNetworkUpdateConfig` (PUT /sandboxes/{id}/network): replaces the whole
    egress policy; a field left out goes back to its default. The SDK sends
    `allow_internet_access` (snake case, as in a create); `allowInternetAccess` is taken too."""

    allow_internet_access: StrictBool | None = None
    allowInternetAccess: StrictBool | None = None

    @model_validator(mode="after")
    def _one_internet_flag(self) -> SandboxNetworkUpdate:
        a, b = self.allow_internet_access, self.allowInternetAccess
        if a is not None and b is not None and a != b:
            raise ValueError("allow_internet_access and allowInternetAccess disagree")
        self.allow_internet_access = a if a is not None else b
        return self


class NetworkInfo(BaseModel):
    """A sandbox's network options, as GET /sandboxes/{id} reports them (`network`)."""

    allowOut: list[str]
    denyOut: list[str]
    dnsServers: list[str] | None = None
    egressProxy: dict[str, Any] | None = None  # never the password or the CA
    rules: dict[str, Any] | None = None  # placeholders as given, never secret values
    allowPublicTraffic: bool = True
    maskRequestHost: str | None = None
    httpsPorts: list[int] | None = None


class NewSandbox(_Body):
    """`NewSandboxV2` (POST /v2/sandboxes) and `NewSandbox` (POST /sandboxes)."""

    templateID: Annotated[StrictStr, Field(min_length=1, max_length=255)]
    timeout: Seconds | None = None
    metadata: StrMap | None = None
    envVars: StrMap | None = None
    secure: StrictBool | None = Field(None, description="v1 only: false omits envdAccessToken")
    autoPause: StrictBool | None = None
    autoPauseMemory: StrictBool | None = Field(
        None, description="false: the timeout auto-pause is filesystem-only (resume reboots)")
    autoResume: AutoResume | None = None
    allow_internet_access: StrictBool | None = None
    network: SandboxNetwork | None = None
    mcp: dict[str, Any] | None = None
    volumeMounts: list[Any] | None = None
    # aenv extensions: the machine shape (defaults: the template's).
    cpuCount: Annotated[StrictInt, Field(ge=1, le=64)] | None = Field(
        None, description="aenv extension: vCPUs of the sandbox's VM"
    )
    memoryMB: Annotated[StrictInt, Field(ge=64, le=262144)] | None = Field(
        None, description="aenv extension: guest RAM in MiB"
    )


class ConnectSandbox(_Body):
    timeout: Seconds | None = None
    memory: StrictBool | None = Field(
        None, description="false: resume a paused sandbox by reboot, discarding its memory")


class SandboxPauseRequest(_Body):
    memory: StrictBool | None = Field(
        None, description="false: filesystem-only pause (only the disk is kept)")
    requireHealthyGuest: StrictBool | None = Field(
        None, description="true: 503 and no pause if the guest's agent does not answer")


class ResumedSandbox(_Body):
    """v1 `POST /sandboxes/{id}/resume`."""

    timeout: Seconds | None = None
    autoPause: StrictBool | None = None


class SandboxSnapshotRequest(_Body):
    name: StrictStr | None = None
    memory: StrictBool | None = Field(
        None, description="false: filesystem-only (the disk alone); a sandbox created from "
        "it cold-boots that disk, without the source's processes or memory")


class SandboxForkRequest(_Body):
    timeout: Seconds | None = None
    count: StrictInt | None = Field(None, description="1-20, default 1")


class SandboxTimeout(_Body):
    timeout: Seconds


class SandboxRefresh(_Body):
    duration: Seconds | None = None


class Error(BaseModel):
    code: int
    message: str


class Sandbox(BaseModel):
    templateID: str
    sandboxID: str
    clientID: str
    envdVersion: str
    alias: str | None = None
    envdAccessToken: str | None = None
    trafficAccessToken: str | None = None
    domain: str | None = None


class Lifecycle(BaseModel):
    onTimeout: Literal["kill", "pause"]
    autoResume: bool


class ListedSandbox(BaseModel):
    templateID: str
    alias: str | None = None
    sandboxID: str
    clientID: str
    startedAt: str
    endAt: str
    envdVersion: str
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    state: Literal["running", "paused"]
    metadata: dict[str, str] = {}
    # aenv: a paused sandbox's tier, "hot" (its stopped VMM is kept) or "cold".
    pauseTier: Literal["hot", "cold"] | None = None
    volumeMounts: list[dict[str, str]] | None = None  # [{name, path}], set only if any
    # aenv, running only: false once its agent missed 3 probes in a row (docs/api.md).
    envdReachable: bool | None = None
    envdLastReachedAt: str | None = None  # RFC 3339; set once a probe was answered


class HostMemory(BaseModel):
    """aenv: what a running sandbox's VMM holds of the host's memory, MiB (docs/api.md)."""

    residentMiB: float  # guest RAM mapped by its VMM
    sharedMiB: float  # of it, pages other VMs map too (its snapshot's)
    ownMiB: float  # of it, pages only it maps (what it wrote, what it alone read)
    pssMiB: float  # the VMM's proportional share: shared pages split, QEMU's own included


class SandboxDetail(ListedSandbox):
    hostMemory: HostMemory | None = None
    envdAccessToken: str | None = None
    domain: str | None = None
    allowInternetAccess: bool | None = None
    network: NetworkInfo | None = None
    lifecycle: Lifecycle
    pauseMode: Literal["full", "filesystem"] | None = None
    # aenv: its lineage on this node: the sandbox (or snapshot) it was forked from, and the
    # live sandboxes forked from it.
    forkedFrom: str | None = None
    forks: list[str] | None = None


class SnapshotInfo(BaseModel):
    snapshotID: str
    names: list[str]


class ListedSnapshot(SnapshotInfo):
    """aenv adds, in listings: when it was taken, of which sandbox and template, and the data
    bytes of its files (blocks it shares with its template or other snapshots included)."""

    createdAt: str | None = None
    sandboxID: str | None = None
    templateID: str | None = None
    sizeBytes: int = 0


class SandboxForkResult(BaseModel):
    """Exactly one of the two."""

    sandbox: Sandbox | None = None
    error: Error | None = None


class SandboxMetric(BaseModel):
    timestamp: str
    timestampUnix: int
    cpuCount: int
    cpuUsedPct: float
    memUsed: int
    memTotal: int
    memCache: int
    diskUsed: int
    diskTotal: int


class SandboxLog(BaseModel):
    timestamp: str
    line: str  # the entry as one JSON line: {"level", "msg", and its fields}


class SandboxLogEntry(BaseModel):
    timestamp: str
    message: str
    level: Literal["debug", "info", "warn", "error"]
    fields: dict[str, str]


class SandboxLogs(BaseModel):
    logs: list[SandboxLog]
    logEntries: list[SandboxLogEntry]


class SandboxLogsV2Response(BaseModel):
    logs: list[SandboxLogEntry]


class SandboxesWithMetrics(BaseModel):
    sandboxes: dict[str, SandboxMetric]  # by sandbox id: its latest sample


class Template(BaseModel):
    templateID: str
    buildID: str
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    public: bool
    aliases: list[str]
    names: list[str]
    createdAt: str
    updatedAt: str
    createdBy: None = None
    lastSpawnedAt: str | None = None
    spawnCount: int = 0
    buildCount: int = 1
    envdVersion: str
    buildStatus: str = "ready"
    # aenv's own (E2B clients ignore them): what it was made from, the data bytes of its
    # files (in listings) and how many of those it shares with other files.
    source: str = ""
    sizeBytes: int = 0
    sharedBytes: int = 0


class TemplateAlias(BaseModel):
    templateID: str
    public: bool


class Health(BaseModel):
    status: str
    version: str | None = None
    accelerator: str | None = None  # kvm or tcg, as the runtime detected it
