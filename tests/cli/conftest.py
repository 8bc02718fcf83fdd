"""The CLI as a user runs it: `.venv/bin/aenv` as a subprocess against a live `aenv server`.

Two nodes, each a real `aenv server` subprocess on a free loopback port (as tests/e2e does):

- `fake_node`: `AENV_RUNTIME=fake` in a temporary data directory. No VMs, no root: for
  listings, errors, prefixes and completion, where cheap sandboxes help.
- `vm_node`: the real runtime on the host's data directory ($AENV_E2E_DATA_DIR, default
  /var/lib/aenv, where `aenv setup` built `base`), for shells, exec and file copies. Needs
  root; skipped otherwise.

Both are checked for leaks: every sandbox a test creates must be gone when the node stops.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.host import DATA_DIR, TEST_IMAGE_REGISTRIES, ServerProcess, free_port, qemu_pids

ROOT = Path(__file__).resolve().parents[2]
AENV = str(ROOT / ".venv" / "bin" / "aenv")
API_KEY = "aenv-cli-test-key"
START_DEADLINE_S = 90
ANSI = "\x1b["


@dataclass
class Node(ServerProcess):
    """One `aenv server` child and a way to run the CLI against it."""

    port: int
    log: Path
    home: Path
    server_env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    cli_env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aenv.cli.main", "server"],
            env=self.server_env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"aenv server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            self.kill9()
            pytest.fail(f"aenv server did not answer /health in time:\n{self.tail()}")
        self.cli_env = cli_env(self.home, AENV_URL=self.url, AENV_API_KEY=API_KEY)

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-API-Key": API_KEY}, timeout=120)

    def cli(self, *args: str, env: dict[str, str] | None = None, input: bytes | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env={**self.cli_env, **(env or {})}, input=input,
                       timeout=timeout)  # fmt: skip

    def sandbox_ids(self) -> list[str]:
        with self.api() as c:
            return [s["sandboxID"] for s in c.get("/v2/sandboxes").json()]

    def kill_all(self) -> list[str]:
        ids = self.sandbox_ids()
        with self.api() as c:
            for sid in ids:
                c.delete(f"/sandboxes/{sid}")
        return ids


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment: own HOME and config dir, nothing pointing at other nodes."""
    # PYTHONDONTWRITEBYTECODE goes too: compiling the CLI afresh on each of many runs is slow.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AENV_", "E2B_", "_AENV_", "FORCE_COLOR", "NO_COLOR",
                                "PYTHONDONTWRITEBYTECODE"))}  # fmt: skip
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), TERM="xterm-256color",
               COLUMNS="200")  # fmt: skip
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str], input: bytes | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([AENV, *args], env=env, input=input, capture_output=True,
                       timeout=timeout)  # fmt: skip
    return subprocess.CompletedProcess(
        p.args, p.returncode,
        p.stdout.decode(errors="surrogateescape"), p.stderr.decode(errors="surrogateescape"),
    )  # fmt: skip


def assert_one_line_error(p: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert p.returncode != 0, p
    lines = p.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
    assert lines[0].startswith("aenv: "), lines
    assert ANSI not in p.stderr and ANSI not in p.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]


def _node(tmp_path_factory: pytest.TempPathFactory, name: str, **env: str) -> Node:
    tmp = tmp_path_factory.mktemp(name)
    home = tmp / "home"
    home.mkdir()
    port = free_port()
    server_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AENV_", "E2B_"))},
        "AENV_INSTANCE": "c" + os.urandom(3).hex(),
        "AENV_API_KEY": API_KEY,
        "AENV_HOST": "127.0.0.1",
        "AENV_PORT": str(port),
        "AENV_LOG_LEVEL": "info",
        "AENV_TTL_SWEEP_INTERVAL_S": "0.25",
        "AENV_PRIMED_POOL_SIZE": "0",  # as in the e2e nodes (tests/e2e/conftest.py)
        "AENV_IMAGE_REGISTRIES": TEST_IMAGE_REGISTRIES,
        **env,
    }
    return Node(port=port, log=tmp / "server.log", home=home, server_env=server_env)


@pytest.fixture(scope="session")
def fake_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    data = tmp_path_factory.mktemp("fake-data")
    n = _node(tmp_path_factory, "fake", AENV_RUNTIME="fake", AENV_DATA_DIR=str(data),
              AENV_MAX_SANDBOXES="100", AENV_MAX_CONCURRENT_BOOTS="100")  # fmt: skip
    n.start()
    try:
        yield n
        left = n.kill_all()
        assert left == [], f"sandboxes left behind on the fake node: {left}"
    finally:
        code = n.stop()
        print(n.tail(100))
    assert code == 0, f"aenv server (fake) exit code {code}"


@pytest.fixture(scope="session")
def vm_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    if os.geteuid() != 0:
        pytest.skip("booting microVMs needs root")
    n = _node(tmp_path_factory, "vm", AENV_DATA_DIR=str(DATA_DIR))
    instance = n.server_env["AENV_INSTANCE"]
    qemu_before = qemu_pids(instance)
    n.start()
    try:
        with n.api() as c:
            names = {a for t in c.get("/templates").json()
                     for a in [t["templateID"], *t["aliases"]]}  # fmt: skip
        if "base" not in names:
            pytest.fail(f"no `base` template under {DATA_DIR}: run `aenv setup` first")
        yield n
        left = n.kill_all()
        assert left == [], f"sandboxes left behind: {left}"
    finally:
        code = n.stop()
        print(n.tail(100))
    assert code == 0, f"aenv server exit code {code}"
    # This run's own (empty) instance directory and database: nobody else uses them.
    with contextlib.suppress(OSError):
        (DATA_DIR / "sandboxes" / instance).rmdir()
    for db in DATA_DIR.glob(f"{instance}.db*"):
        db.unlink(missing_ok=True)
    leaked = qemu_pids(instance) - qemu_before
    assert not leaked, f"QEMU processes left after the node stopped: {sorted(leaked)}"


@pytest.fixture(scope="module")
def sandbox(vm_node: Node) -> Iterator[str]:
    """One detached sandbox for a module's tests."""
    p = vm_node.cli("start", "-d", "base", "--timeout", "600")
    assert p.returncode == 0, p.stderr
    sid = p.stdout.strip()
    yield sid
    with vm_node.api() as c:
        c.delete(f"/sandboxes/{sid}")
