"""A live node for the SDK: `aenv server` as a real subprocess on a free loopback port.

It uses the node's real data directory ($AENV_DATA_DIR, default /var/lib/aenv, where
`aenv setup` built the kernel and the `base` template) and a fixed API key, and exports
E2B_API_URL = E2B_SANDBOX_URL = its origin and E2B_API_KEY for the unmodified `e2b` SDK.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

import aenv.machines.runtime  # noqa: F401 (what the suite drives: a broken one fails collection)
from tests.support import census
from tests.support.host import (  # noqa: F401 (re-exported)
    DATA_DIR,
    TEST_IMAGE_REGISTRIES,
    ServerProcess,
    free_port,
    qemu_pids,
)
from tests.support.image_state import removed_after
from tests.support.registry import Seeded, seeded_registry

API_KEY = "aenv-e2e-key"
START_DEADLINE_S = 90


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Root is a requirement of this suite (it boots microVMs): without it every test fails,
    # it does not skip (a run that skipped them all would be green and have tested nothing).
    if "tests/e2e/" in str(item.fspath) and os.geteuid() != 0:
        pytest.fail("the e2e suite boots microVMs: it needs root", pytrace=False)


@dataclass
class NodeProcess(ServerProcess):
    """One `aenv server` child. `origin` is its base URL; `log` its stderr."""

    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. AENV_MAX_SANDBOXES
    # True once it serves; default: plain HTTP /health at `origin` (a TLS node has its own).
    probe: Callable[[], bool] | None = None

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.env = {
            **os.environ,
            "AENV_DATA_DIR": str(DATA_DIR),
            # Its own slots, cgroups, VM directories and database: concurrent test runs on
            # one host share only templates and artifacts.
            "AENV_INSTANCE": os.environ.get("AENV_INSTANCE") or "e" + os.urandom(3).hex(),
            "AENV_API_KEY": API_KEY,
            "AENV_HOST": "127.0.0.1",
            "AENV_PORT": str(self.port),
            "AENV_LOG_LEVEL": os.environ.get("AENV_E2E_LOG_LEVEL", "debug"),
            "AENV_TTL_SWEEP_INTERVAL_S": "0.25",
            # Off but in test_primed.py: a primed VM would serve every create of `base`,
            # refill (CPU) after each, and add to the VMs the tests count.
            "AENV_PRIMED_POOL_SIZE": "0",
            "AENV_IMAGE_REGISTRIES": TEST_IMAGE_REGISTRIES,
            **self.extra_env,
        }
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "aenv.cli.main", "server"],
            env=self.env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"aenv server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if (self.probe() if self.probe is not None else
                        httpx.get(self.origin + "/health", timeout=1).status_code == 200):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.kill9()
        pytest.fail(f"aenv server did not answer /health in {START_DEADLINE_S} s:\n{self.tail()}")

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.origin, headers={"X-API-Key": API_KEY}, timeout=120)


def require_base_template(node: NodeProcess) -> None:
    with node.api() as c:
        names = {a for t in c.get("/templates").json() for a in [t["templateID"], *t["aliases"]]}
    if "base" not in names:
        pytest.fail(f"no `base` template under {DATA_DIR}: run `aenv setup` first")


@contextlib.contextmanager
def sdk_pointed_at(n: NodeProcess) -> Iterator[None]:
    """The unmodified E2B SDK's env (E2B_API_URL, ...) points at `n` while inside."""
    env = {"E2B_API_URL": n.origin, "E2B_SANDBOX_URL": n.origin, "E2B_API_KEY": API_KEY,
           "E2B_VOLUME_API_URL": n.origin}  # else the SDK's volume content calls go to E2B
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def assert_no_sandboxes(n: NodeProcess) -> None:
    with n.api() as c:
        left = c.get("/v2/sandboxes").json()
    assert left == [], f"sandboxes left behind: {left}"


def stop_node(n: NodeProcess) -> int | None:
    """Stop `n` if it still runs (its exit code), and print the end of its log."""
    code = n.stop() if n.proc and n.proc.poll() is None else n.proc and n.proc.returncode
    print(n.tail(200))
    return code


def start_node(log: Path, instance: str, monkeypatch: pytest.MonkeyPatch,
               port: int | None = None, **env: str) -> NodeProcess:
    """One node process of `instance` (tests that kill -9 and restart nodes), with the SDK's
    env pointed at it for the rest of the test. The caller stops it."""
    n = NodeProcess(port or free_port(), log, extra_env={"AENV_INSTANCE": instance, **env})
    n.start()
    require_base_template(n)
    for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL"):
        monkeypatch.setenv(k, n.origin)
    monkeypatch.setenv("E2B_API_KEY", API_KEY)
    return n


@contextlib.contextmanager
def running_node(log_dir: Path, **extra_env: str) -> Iterator[NodeProcess]:
    """A node with the SDK's env pointed at it; after it stops, the leak census of its
    instance must be clean. An instance of its own is then released (database, directory,
    and whatever a failed node left), whether the test passed or not."""
    own = not os.environ.get("AENV_INSTANCE") and "AENV_INSTANCE" not in extra_env
    n = NodeProcess(free_port(), log_dir / "server.log", extra_env=extra_env)
    try:
        n.start()
        with sdk_pointed_at(n):
            require_base_template(n)
            yield n
            if n.proc is not None and n.proc.poll() is None:  # a test may stop it itself
                assert_no_sandboxes(n)
    finally:
        code = stop_node(n)
        instance = n.env.get("AENV_INSTANCE", "")
        leaks = census.check_stopped(instance) if instance else []
        if own and instance:
            census.release(instance)
    assert code == 0, f"aenv server exit code {code}"
    assert not leaks, "left after the node stopped:\n" + "\n".join(leaks)


@pytest.fixture
def instance() -> Iterator[str]:
    """A node instance of its own for a test whose node processes succeed one another (kill
    -9 and restart); its census must be clean after, and then it is released."""
    name = os.environ.get("AENV_INSTANCE") or census.new_instance()
    try:
        yield name
        leaks = census.check_stopped(name)
        assert not leaks, f"left by instance {name}:\n" + "\n".join(leaks)
    finally:
        if not os.environ.get("AENV_INSTANCE"):
            census.release(name)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node for this module, with the SDK's env pointed at it; checked for leaks after."""
    with running_node(tmp_path_factory.mktemp("node")) as n:
        yield n


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """A registry on loopback holding the test images (tests/support/registry.py), for a
    module; the images and templates it made are removed after."""
    with removed_after(), seeded_registry(tmp_path_factory.mktemp("registry")) as s:
        yield s


def output_in_new_sandbox(template: str, cmd: str) -> str:
    """What `cmd` prints in a new sandbox of `template`, killed after."""
    from e2b import Sandbox

    sbx = Sandbox.create(template, timeout=120)
    try:
        return sbx.commands.run(cmd).stdout
    finally:
        sbx.kill()
