"""Node configuration: embedded defaults, then an optional TOML file, then AENV_* env vars.

One typed object is read once at start-up and handed down; nothing else reads the
environment. Paths are made absolute at load time. A bad value is a `ConfigError`: one line
naming the setting, its value (never a secret's) and the rule (aenv.config_errors).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from aenv import faults
from aenv.config_errors import ConfigError, Explainer, is_secret, show_value

ENV_PREFIX = "AENV_"
# A node instance name (`Config.instance`); the leak census parses names built from it.
INSTANCE_PATTERN = r"[a-z][a-z0-9]{0,7}"
DEFAULT_CONFIG_FILE = Path("/etc/aenv/config.toml")


class MachineShape(BaseModel, frozen=True):
    """What a VMM must be started with; microvm has no hotplug, so this keys warm pools."""

    vcpus: int = Field(1, ge=1, le=64)
    memory_mib: int = Field(512, ge=64, le=262144)
    disk_mib: int = Field(4096, ge=64, le=1048576)


class RegistryConfig(BaseModel):
    """`[registry]`: how images are pulled (aenv.images)."""

    # Docker's registry-mirrors: "docker.io" = ["http://mirror:5000"]; tried before the
    # registry itself, so an offline site serves `ubuntu:22.04` from its own registry.
    mirrors: dict[str, list[str]] = Field(default_factory=dict)
    # Registries (host[:port]) that may be plain HTTP; loopback ones always may, as in Docker.
    insecure: list[str] = Field(default_factory=list)
    auth_file: Path | None = None  # a Docker config.json with credentials per registry
    ca_file: Path | None = None  # a PEM CA trusted besides the system store
    insecure_loopback: bool = True  # false: loopback registries need verified HTTPS too


class ClusterConfig(BaseModel):
    """Membership of a cluster (docs/cluster.md). No etcd endpoints: a standalone node."""

    etcd_endpoints: list[str] = Field(default_factory=list)
    prefix: str = Field("/aenv/", pattern=r"^/.*/$")  # every key aenv writes is under it
    # default: "<hostname>-<instance>". A name is the last part of etcd keys: no "/" or "@".
    node_name: str = Field("", pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]{0,62})?$")
    node_url: str = ""  # how gateways reach this node; default: public_url or http://host:port
    lease_ttl_s: int = Field(10, ge=2, le=300)  # a dead node is lost within this
    # Shared by every node and gateway of the cluster: a gateway's create names the
    # sandbox id it bound, and only a request carrying this token may.
    token: str = ""
    gateway_port: int = 8080  # `aenv gateway` listens here (on `host`)
    # A node absent this long (no member record) is forgotten: its bindings and reservation
    # go, but those of sandboxes whose paused state is published (cluster/forgetting.py).
    forget_lost_after_s: int = Field(3600, ge=60)
    # The link to etcd (cluster/etcd.py, docs/cluster.md "etcd"): https endpoints verified
    # against this CA, a client certificate, and etcd's own users. Off this host it must be
    # https with one of them, unless etcd_insecure says otherwise (logged at every start).
    etcd_ca_file: Path | None = None
    etcd_cert_file: Path | None = None
    etcd_key_file: Path | None = None
    etcd_user: str = ""
    etcd_password: str = ""
    etcd_insecure: bool = False
    # The links between gateways and nodes and between nodes (cluster/links.py, docs/cluster.md
    # "Links"): the cluster CA's certificate, and this member's certificate and key, signed
    # by it (`aenv cluster ca`). A node then serves its cluster listener on `link_port`
    # (0: `port` + 1) over HTTPS that asks every caller for a certificate of that CA, and its
    # cluster token is taken there only. Plain HTTP off this host only with insecure_links.
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    link_port: int = Field(0, ge=0, le=65535)
    insecure_links: bool = False
    # Rotation (docs/cluster.md "Rotation"): more tokens a node takes besides `token`, while
    # the cluster's members move from one to the next.
    accept_tokens: list[str] = Field(default_factory=list)
    # The token from a file instead (0600), taken again when it changes: its first line is
    # the token sent, every line one taken (links.TokenFile; rotation without restarts).
    token_file: Path | None = None
    _file_tokens: list[str] = PrivateAttr(default_factory=list)  # its lines past the first

    @property
    def link_tls(self) -> bool:
        return self.cert_file is not None

    def tokens_taken(self) -> list[str]:
        """Every token a node takes: its own, accept_tokens, and a token file's others."""
        return [t for t in (self.token, *self.accept_tokens, *self._file_tokens) if t]

    def take_token_file(self, lines: list[str]) -> None:
        self.token, self._file_tokens = lines[0], lines[1:]

    @model_validator(mode="after")
    def _etcd_pairs(self) -> ClusterConfig:
        if (self.ca_file is None) != (self.cert_file is None):
            raise PydanticCustomError("together", "must be set together",
                                      {"fields": ("ca_file", "cert_file")})  # fmt: skip
        for a, b in (("etcd_cert_file", "etcd_key_file"), ("etcd_user", "etcd_password"),
                     ("cert_file", "key_file")):  # fmt: skip
            if bool(getattr(self, a)) != bool(getattr(self, b)):
                raise PydanticCustomError("together", "must be set together",
                                          {"fields": (a, b)})  # fmt: skip
        return self

    @field_validator("etcd_ca_file", "etcd_cert_file", "etcd_key_file", "ca_file",
                     "cert_file", "key_file", "token_file", mode="after")
    @classmethod
    def _absolute(cls, v: Path | None) -> Path | None:
        return v.expanduser().absolute() if v is not None else None


class StoreConfig(BaseModel):
    """`[store]`: the snapshot store (docs/cluster.md, "Snapshot store"). No url: none; a
    node then shares snapshots with its peers only (fetched from one that holds them)."""

    # "s3://bucket/prefix" (boto3; credentials from its usual chain) or "file:///shared/dir"
    url: str = Field("", pattern=r"^(|s3://[^/]+(/.*)?|file:///.*)$")
    endpoint_url: str = ""  # an S3-compatible endpoint (MinIO, Ceph, moto); "" for AWS
    region: str = ""
    # Snapshots this node fetched (from a peer or the store) are a cache: least recently
    # used first out beyond this bound, never one a restore in flight uses.
    cache_bytes: int = Field(64 << 30, ge=1 << 20)
    # Publish a sandbox's paused state when it pauses, so that it may resume on another
    # node (a sandbox's own `aenv.publish` metadata, "true" or "false", wins).
    publish_paused: bool = False
    # Publish this node's templates (all but its default, which every node builds itself),
    # so that a create from one works on any node, even once this node is gone.
    publish_templates: bool = True


class NetworkConfig(BaseModel):
    """`[network]`: sandboxes' egress defaults (network/egress.py, docs/security.md)."""

    # As E2B: a sandbox that names nothing reaches public destinations. false: only what a
    # create or update opens (allow_internet_access, allowOut).
    internet_by_default: bool = True
    # CIDRs inside the special ranges (private, 198.18/15, ...) this node treats as public
    # internet: a lab's or a test's simulated internet. Never the slot network.
    public_ranges: list[str] = Field(default_factory=list)
    # The CA the egress proxy signs its certificates with for `network.rules` domains
    # (PEM certificate and key; made on first use at <data_dir>/egress-ca.{pem,key} unless
    # named). Every node of a cluster needs the same pair: guests trust it.
    ca_cert_file: Path | None = None
    ca_key_file: Path | None = None
    # Extra CAs (PEM) the egress proxy trusts for the servers behind `network.rules`
    # domains, beside the system store: a lab's or a test's private CA.
    upstream_ca_file: Path | None = None

    @field_validator("public_ranges")
    @classmethod
    def _inside_special(cls, v: list[str]) -> list[str]:
        from aenv.network.egress import EgressPolicyError, public_ranges

        try:
            public_ranges(v)
        except EgressPolicyError as e:
            raise ValueError(str(e)) from None
        return v


class Config(BaseModel):
    data_dir: Path = Path("/var/lib/aenv")
    # Sparse XFS image mounted at data_dir when data_dir's filesystem cannot reflink.
    data_image_size_gib: int = 64
    # Names what this node owns on the host (slot namespaces, cgroups, VM directories,
    # database), so several nodes (e.g. concurrent test runs) can share one data directory's
    # templates and artifacts without touching each other's sandboxes.
    instance: str = Field("aenv", pattern=rf"^{INSTANCE_PATTERN}$")
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    domain: str | None = None
    # HTTPS on `port` (a node or a gateway): a certificate for `api.<domain>` and
    # `*.<domain>` (PEM, with its chain) and its key. Then clients need only E2B_DOMAIN.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # The web console (docs/console.md) on an origin of its own, so that no sandbox page the
    # data plane serves on the API's origin shares it: `console_port` (0: `port` + 2), over
    # TLS when `port` is. `console_origin`: where browsers open it when that is not
    # http(s)://host:console_port (a proxy, console.<domain>); the API answers CORS for it.
    console: bool = True
    console_port: int = Field(0, ge=0, le=65535)
    console_origin: str = ""
    # How often the node samples what teams hold for the console's overview (the last hour
    # is kept, GET /overview).
    overview_sample_s: float = Field(10.0, gt=0, le=300)
    # The key that encrypts secrets at rest (32 random bytes, made on first use at
    # <data_dir>/secrets.key unless named). Every node of a cluster needs the same one.
    secrets_key_file: Path | None = None

    accel: Literal["auto", "kvm", "tcg"] = "auto"
    # Under TCG, each VMM's translated-code buffer (MiB), most of QEMU's own memory once a
    # guest has run a while; smaller costs re-translation (docs/runtime.md, "QEMU's own
    # memory"). Not used under KVM.
    tcg_tb_mib: int = Field(64, ge=8, le=1024)
    qemu_binary: str = "qemu-system-x86_64"
    # Any other bzImage; empty means the kernel aenv builds from linux-source-6.12.
    kernel_path: Path | None = None
    kernel_cmdline_extra: str = ""

    default_shape: MachineShape = MachineShape()
    default_template: str = "base"
    # A node whose default template is `base` and has none makes the familiar one in the
    # background while it serves (images/bases.py); false: only `aenv setup` makes it.
    build_base: bool = True
    # A create naming a template that is being built, pulled or fetched waits this long for
    # it, then gets 503 with Retry-After (below the E2B SDK's 60 s request timeout).
    template_wait_s: float = Field(30.0, ge=0, le=3600)

    # Jail: each QEMU runs as uid/gid jail_uid_base + slot index (no /etc/passwd entries).
    jail_uid_base: int = 880000
    jail_uid_count: int = 4096
    # Memory the QEMU process may use beyond guest RAM (code, TCG translation cache, devices).
    jail_memory_overhead_mib: int = 384
    jail_pids_max: int = 256

    # Network: host-side addresses come from 198.18.0.0/15, four per slot.
    slot_network: str = "198.18.0.0/15"
    max_slots: int = 4096
    network: NetworkConfig = NetworkConfig()

    # Pre-spawned QEMUs waiting for an incoming restore, for the default template's shape:
    # a create or resume then skips QEMU start-up. 0 disables the pool.
    warm_pool_size: int = Field(2, ge=0, le=64)
    # Default-template VMs restored and run until their agent answered, then stopped: a
    # create from the default template continues one (under TCG: no restore, no first-
    # request translation). Each holds its touched guest RAM. 0 disables it.
    primed_pool_size: int = Field(1, ge=0, le=64)
    # The same for the user snapshots creates (or snapshot forks) used most recently, one
    # budget for all: each older snapshot keeps one VM, the newest the rest. 0 disables it.
    primed_snapshot_pool_size: int = Field(1, ge=0, le=64)
    # Under TCG, priming also runs a shell as a first command would (machines/guest_warm.py),
    # so a sandbox's first command and terminal find their code translated.
    prime_warm: bool = True
    max_sandboxes: int = 64
    # The hot pause tier: a full pause keeps the stopped VMM (and its slot) for up to
    # hot_pause_s, so a resume continues it (no restore, no re-translation under TCG), and
    # hands its guest RAM back to the host after hot_release_delay_s (0: at once). Hot VMMs
    # have their own budget, by count and by resident memory, apart from max_sandboxes;
    # beyond it, under host memory pressure (PSI `some avg10` over hot_psi_avg10) and at
    # shutdown the oldest become cold (today's pause: the VMM ends). hot_pause_s 0: off.
    hot_pause_s: float = Field(300.0, ge=0)
    hot_release_delay_s: float = Field(5.0, ge=0)
    hot_pause_max: int = Field(32, ge=0)
    hot_pause_memory_mib: int = Field(4096, ge=0)
    hot_psi_avg10: float = Field(10.0, gt=0, le=100)
    # A running sandbox with no data-plane request for this long hands back the memory its
    # guest wrote (machines/reclaiming.py): written to its RAM file, then dropped. 0: never.
    reclaim_idle_s: float = Field(60.0, ge=0)
    # Guest RAM the node commits: running VMs' shapes plus hot VMMs' resident memory. A
    # create, resume or fork that would go past it first demotes the oldest hot VMMs.
    # 0: the host's MemTotal less 2 GiB.
    memory_budget_mib: int = Field(0, ge=0)
    # How far the running sandboxes' nominal RAM may pass the budget when what they hold,
    # measured, fits it (orchestrator/memory_admission.py).
    memory_overcommit: float = Field(4.0, gt=0)
    max_concurrent_boots: int = 4
    # Images a create may name instead of a template (pulled on demand, images/on_demand.py)
    # and the build API's fromImage may start from: registries as `host` (any port),
    # `host:port` or `host/path` (a repository prefix); "*" any. Not the node's own exports.
    image_registries: list[str] = Field(default_factory=lambda: list(PUBLIC_REGISTRIES))
    image_metadata_key: str = ""  # a create's metadata under this key names its image
    image_short_names: bool = False  # `ubuntu:22.04`, no template of that name: Docker Hub's
    # A create (or reboot) past max_concurrent_boots waits this long for a boot to end
    # before its 429 (orchestrator/boots.py); below the SDK's 60 s request timeout.
    admission_queue_s: float = Field(30.0, ge=0, le=50)
    # SIGTERM: "kill" ends every running sandbox; "pause" pauses them (resumable after a
    # restart). Paused sandboxes stay paused either way.
    on_shutdown: Literal["pause", "kill"] = "kill"
    # Space admission: create, resume, fork and snapshot need free space on the data
    # filesystem >= RAM of the running sandboxes (their sparse RAM files may fill) + this.
    disk_reserve_mib: int = Field(1024, ge=0)
    log_level: str = "info"
    registry: RegistryConfig = RegistryConfig()
    cluster: ClusterConfig = ClusterConfig()
    store: StoreConfig = StoreConfig()
    # The node's snapshot repository; default: data_dir/snapshots, shared by the instances
    # of one data directory. Nodes of one host that must not share it set their own.
    snapshots_path: Path | None = None
    # The node's template catalog; default: data_dir/templates (as snapshots_path).
    templates_path: Path | None = None
    # Where volumes' data lives; default: data_dir/volumes/<instance>. Nodes of a cluster
    # that resume or fork each other's sandboxes need one they all reach (shared storage).
    volumes_path: Path | None = None
    # Template builds (E2B's build API): how many run at once, what their build VMs may reach
    # (CIDRs; "0.0.0.0/0" is the public internet, as E2B gives builds for apt-get and pip;
    # private and host ranges stay closed), and the largest build context archive.
    # The image cache's bound (blobs of pulled images): images no template was made from are
    # evicted, least recently used first, beyond it.
    image_cache_bytes: int = Field(32 << 30, ge=1 << 20)
    # A pulled image whose layers extend a template's image is made on that template (its
    # extra layers applied in a VM of it) rather than from a disk of its own.
    layered_pulls: bool = True
    # The step cache's bound (build snapshots after each step): least recently used beyond it.
    step_cache_bytes: int = Field(16 << 30, ge=1 << 20)
    max_concurrent_builds: int = Field(2, ge=1, le=64)
    # The origin clients reach this node at, for URLs it hands out (build file uploads);
    # unset: the origin of the request (its Host header), as seen behind a proxy too.
    public_url: str | None = None
    build_egress_allow: list[str] = Field(default_factory=lambda: ["0.0.0.0/0"])
    build_context_max_bytes: int = Field(1 << 30, ge=1 << 20)
    # All build contexts kept (for rebuilds of the same files): least recently used beyond it.
    build_contexts_bytes: int = Field(4 << 30, ge=0)

    # Which Runtime the node drives: "qemu" (real microVMs) or "fake" (no VMs; API tests only).
    runtime: Literal["qemu", "fake"] = "qemu"
    # Longest TTL a create/set_timeout/connect may ask for (E2B's own cap is 24 h).
    max_timeout_s: int = Field(86400, ge=1)
    # How often the TTL sweeper looks for expired sandboxes: bounds how late a kill at endAt is.
    ttl_sweep_interval_s: float = Field(0.5, gt=0)
    # How often each running sandbox's agent /metrics is sampled (E2B uses ~5 s buckets).
    metrics_interval_s: float = Field(5.0, gt=0)
    # How long a call waits for another call's in-flight transition on the same sandbox
    # (a boot or a kill) before giving up with 409.
    transition_wait_s: float = Field(120.0, gt=0)
    # After SIGTERM, how long open requests get to finish before VMs are ended anyway.
    shutdown_grace_s: float = Field(10.0, ge=0)
    # Crash testing only: named fault points to arm, "point=exit,point2=kill" (aenv.faults).
    # An armed point ends the node abruptly when an operation reaches it.
    faults: str = ""
    # The snapshot scrubber re-hashes every stored snapshot's chunks this often (0: off);
    # silent corruption of files at rest is rare, so hours are enough.
    scrub_interval_s: float = Field(21600.0, ge=0)
    # ...reading at most this fast (holes cost nothing), so a pass does not take the CPU
    # and disk bandwidth sandboxes need: 64 MiB/s is ~5% of one core at ~1.2 GB/s SHA-256.
    scrub_rate_mib_s: float = Field(64.0, gt=0)

    @field_validator("faults")
    @classmethod
    def _known_faults(cls, v: str) -> str:
        faults.parse(v)  # an unknown point or action fails at start-up, not never
        return v

    @model_validator(mode="after")
    def _tls_pair(self) -> Config:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            # `fields`: the settings the error names (a model's errors have no location)
            raise PydanticCustomError("together", "must be set together",
                                      {"fields": ("tls_cert_file", "tls_key_file")})
        return self

    @field_validator("data_dir", "kernel_path", "tls_cert_file", "tls_key_file",
                     "secrets_key_file", mode="after")
    @classmethod
    def _absolute(cls, v: Path | None) -> Path | None:
        return v.expanduser().absolute() if v is not None else None

    # Derived locations under the data directory: one place names them.
    @property
    def db_path(self) -> Path:
        return self.data_dir / f"{self.instance}.db"

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"

    @property
    def templates_dir(self) -> Path:
        return self.templates_path or self.data_dir / "templates"

    @property
    def images_dir(self) -> Path:
        return self.data_dir / "images"

    @property
    def volumes_dir(self) -> Path:
        return self.volumes_path or self.data_dir / "volumes" / self.instance

    @property
    def snapshots_dir(self) -> Path:
        return self.snapshots_path or self.data_dir / "snapshots"

    @property
    def sandboxes_dir(self) -> Path:
        return self.data_dir / "sandboxes" / self.instance

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "run"


_SIMPLE_ENV = {
    "DATA_DIR": "data_dir",
    "INSTANCE": "instance",
    "HOST": "host",
    "PORT": "port",
    "API_KEY": "api_key",
    "DOMAIN": "domain",
    "TLS_CERT_FILE": "tls_cert_file",
    "TLS_KEY_FILE": "tls_key_file",
    "CONSOLE": "console",
    "CONSOLE_PORT": "console_port",
    "CONSOLE_ORIGIN": "console_origin",
    "OVERVIEW_SAMPLE_S": "overview_sample_s",
    "SECRETS_KEY_FILE": "secrets_key_file",
    "ACCEL": "accel",
    "TCG_TB_MIB": "tcg_tb_mib",
    "QEMU_BINARY": "qemu_binary",
    "KERNEL_PATH": "kernel_path",
    "DEFAULT_TEMPLATE": "default_template",
    "BUILD_BASE": "build_base",
    "TEMPLATE_WAIT_S": "template_wait_s",
    "MAX_SANDBOXES": "max_sandboxes",
    "HOT_PAUSE_S": "hot_pause_s",
    "HOT_RELEASE_DELAY_S": "hot_release_delay_s",
    "HOT_PAUSE_MAX": "hot_pause_max",
    "HOT_PAUSE_MEMORY_MIB": "hot_pause_memory_mib",
    "HOT_PSI_AVG10": "hot_psi_avg10",
    "RECLAIM_IDLE_S": "reclaim_idle_s",
    "MEMORY_BUDGET_MIB": "memory_budget_mib",
    "MEMORY_OVERCOMMIT": "memory_overcommit",
    "SLOT_NETWORK": "slot_network",
    "WARM_POOL_SIZE": "warm_pool_size",
    "PRIMED_POOL_SIZE": "primed_pool_size",
    "PRIMED_SNAPSHOT_POOL_SIZE": "primed_snapshot_pool_size",
    "PRIME_WARM": "prime_warm",
    "MAX_CONCURRENT_BOOTS": "max_concurrent_boots",
    "ADMISSION_QUEUE_S": "admission_queue_s",
    "IMAGE_METADATA_KEY": "image_metadata_key",
    "IMAGE_SHORT_NAMES": "image_short_names",
    "ON_SHUTDOWN": "on_shutdown",
    "DISK_RESERVE_MIB": "disk_reserve_mib",
    "LOG_LEVEL": "log_level",
    "JAIL_UID_BASE": "jail_uid_base",
    "RUNTIME": "runtime",
    "MAX_TIMEOUT_S": "max_timeout_s",
    "TTL_SWEEP_INTERVAL_S": "ttl_sweep_interval_s",
    "METRICS_INTERVAL_S": "metrics_interval_s",
    "TRANSITION_WAIT_S": "transition_wait_s",
    "SHUTDOWN_GRACE_S": "shutdown_grace_s",
    "FAULTS": "faults",
    "SCRUB_INTERVAL_S": "scrub_interval_s",
    "SCRUB_RATE_MIB_S": "scrub_rate_mib_s",
    "MAX_CONCURRENT_BUILDS": "max_concurrent_builds",
    "IMAGE_CACHE_BYTES": "image_cache_bytes",
    "STEP_CACHE_BYTES": "step_cache_bytes",
    "LAYERED_PULLS": "layered_pulls",
    "PUBLIC_URL": "public_url",
    "BUILD_CONTEXT_MAX_BYTES": "build_context_max_bytes",
    "BUILD_CONTEXTS_BYTES": "build_contexts_bytes",
    "SNAPSHOTS_DIR": "snapshots_path",
    "TEMPLATES_DIR": "templates_path",
    "VOLUMES_DIR": "volumes_path",
}


PUBLIC_REGISTRIES = ("docker.io", "ghcr.io", "quay.io", "gcr.io", "public.ecr.aws",
                     "registry.k8s.io", "mcr.microsoft.com", "nvcr.io")


def _csv(text: str) -> list[str]:
    """A comma-separated env value as a list, blanks dropped."""
    return [x.strip() for x in text.split(",") if x.strip()]


_CLUSTER_ENV = {
    "CLUSTER_PREFIX": "prefix",
    "NODE_NAME": "node_name",
    "NODE_URL": "node_url",
    "CLUSTER_LEASE_TTL_S": "lease_ttl_s",
    "CLUSTER_TOKEN": "token",
    "GATEWAY_PORT": "gateway_port",
    "CLUSTER_FORGET_LOST_AFTER_S": "forget_lost_after_s",
    "ETCD_CA_FILE": "etcd_ca_file",
    "ETCD_CERT_FILE": "etcd_cert_file",
    "ETCD_KEY_FILE": "etcd_key_file",
    "ETCD_USER": "etcd_user",
    "ETCD_PASSWORD": "etcd_password",
    "ETCD_INSECURE": "etcd_insecure",
    "CLUSTER_CA_FILE": "ca_file",
    "CLUSTER_CERT_FILE": "cert_file",
    "CLUSTER_KEY_FILE": "key_file",
    "CLUSTER_LINK_PORT": "link_port",
    "CLUSTER_INSECURE_LINKS": "insecure_links",
    "CLUSTER_TOKEN_FILE": "token_file",
}

_NETWORK_ENV = {
    "NETWORK_INTERNET_BY_DEFAULT": "internet_by_default",
    "NETWORK_CA_CERT_FILE": "ca_cert_file",
    "NETWORK_CA_KEY_FILE": "ca_key_file",
    "NETWORK_UPSTREAM_CA_FILE": "upstream_ca_file",
}

_STORE_ENV = {
    "STORE_URL": "url",
    "STORE_ENDPOINT_URL": "endpoint_url",
    "STORE_REGION": "region",
    "STORE_CACHE_BYTES": "cache_bytes",
    "STORE_PUBLISH_PAUSED": "publish_paused",
    "STORE_PUBLISH_TEMPLATES": "publish_templates",
}


# Each setting an environment variable sets (a table's key path -> the variable).
ENV_NAMES: dict[tuple[str, ...], str] = {
    **{(field,): ENV_PREFIX + suffix for suffix, field in _SIMPLE_ENV.items()},
    ("build_egress_allow",): ENV_PREFIX + "BUILD_EGRESS_ALLOW",
    ("image_registries",): ENV_PREFIX + "IMAGE_REGISTRIES",
    ("registry", "mirrors"): ENV_PREFIX + "REGISTRY_MIRRORS",
    **{("cluster", key): ENV_PREFIX + suffix for suffix, key in _CLUSTER_ENV.items()},
    ("cluster", "etcd_endpoints"): ENV_PREFIX + "ETCD_ENDPOINTS",
    **{("network", key): ENV_PREFIX + suffix for suffix, key in _NETWORK_ENV.items()},
    ("network", "public_ranges"): ENV_PREFIX + "NETWORK_PUBLIC_RANGES",
    **{("store", key): ENV_PREFIX + suffix for suffix, key in _STORE_ENV.items()},
}


def _read_file(file: Path, named_by: str) -> dict[str, object]:
    try:
        with open(file, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{named_by}: cannot read {file}: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{file}: not a valid TOML file: {e}") from None


def _table(data: dict[str, object], key: str, file: Path | None) -> dict[str, object]:
    """The TOML table `key` (a copy; empty if absent): env vars are merged into it."""
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key} in {file}: {show_value(value, is_secret((key,)))} "
                          f"must be a table")  # fmt: skip
    return dict(value)


def load(
    path: Path | None = None, env: dict[str, str] | None = None, **overrides: object
) -> Config:
    """Build the config. `overrides` (e.g. CLI flags) win over env, env over the file.
    Raises ConfigError, one line, for a bad value or a file that cannot be read or parsed."""
    env = dict(os.environ) if env is None else env
    data: dict[str, object] = {}
    file = path or (Path(env[ENV_PREFIX + "CONFIG"]) if ENV_PREFIX + "CONFIG" in env else None)
    named_by = "--config" if path else ENV_PREFIX + "CONFIG"
    if file is None and DEFAULT_CONFIG_FILE.exists():
        file, named_by = DEFAULT_CONFIG_FILE, "the default config file"
    if file is not None:
        data.update(_read_file(file, named_by))
    for suffix, field in _SIMPLE_ENV.items():
        if ENV_PREFIX + suffix in env:
            data[field] = env[ENV_PREFIX + suffix]
    if ENV_PREFIX + "IMAGE_REGISTRIES" in env:  # "docker.io,127.0.0.1:5000,ghcr.io/org"
        data["image_registries"] = _csv(env[ENV_PREFIX + "IMAGE_REGISTRIES"])
    if ENV_PREFIX + "BUILD_EGRESS_ALLOW" in env:  # "198.19.0.0/16,10.1.2.3/32"
        data["build_egress_allow"] = _csv(env[ENV_PREFIX + "BUILD_EGRESS_ALLOW"])
    if ENV_PREFIX + "REGISTRY_MIRRORS" in env:  # "docker.io=http://a:5000,http://b;ghcr.io=..."
        mirrors: dict[str, list[str]] = {}
        for item in filter(None, env[ENV_PREFIX + "REGISTRY_MIRRORS"].split(";")):
            prefix, _, urls = item.partition("=")
            mirrors[prefix.strip()] = _csv(urls)
        registry = _table(data, "registry", file)
        registry["mirrors"] = mirrors
        data["registry"] = registry
    cluster = _table(data, "cluster", file)
    for suffix, key in _CLUSTER_ENV.items():
        if ENV_PREFIX + suffix in env:
            cluster[key] = env[ENV_PREFIX + suffix]
    if ENV_PREFIX + "ETCD_ENDPOINTS" in env:  # "http://10.0.0.1:2379,http://10.0.0.2:2379"
        cluster["etcd_endpoints"] = _csv(env[ENV_PREFIX + "ETCD_ENDPOINTS"])
    if ENV_PREFIX + "CLUSTER_ACCEPT_TOKENS" in env:  # comma-separated
        cluster["accept_tokens"] = _csv(env[ENV_PREFIX + "CLUSTER_ACCEPT_TOKENS"])
    data["cluster"] = cluster
    network = _table(data, "network", file)
    for suffix, key in _NETWORK_ENV.items():
        if ENV_PREFIX + suffix in env:
            network[key] = env[ENV_PREFIX + suffix]
    if ENV_PREFIX + "NETWORK_PUBLIC_RANGES" in env:  # "198.19.0.0/16,10.9.0.0/16"
        network["public_ranges"] = _csv(env[ENV_PREFIX + "NETWORK_PUBLIC_RANGES"])
    data["network"] = network
    store = _table(data, "store", file)
    for suffix, key in _STORE_ENV.items():
        if ENV_PREFIX + suffix in env:
            store[key] = env[ENV_PREFIX + suffix]
    data["store"] = store
    overrides = {k: v for k, v in overrides.items() if v is not None}
    data.update(overrides)
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        sources: dict[tuple[str | int, ...], str] = {
            loc: name for loc, name in ENV_NAMES.items() if name in env}
        sources.update({(k,): "--" + k.replace("_", "-") for k in overrides})
        raise Explainer(data, sources, ENV_NAMES, file).explain(e.errors()) from None
