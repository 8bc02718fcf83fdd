"""Runners of the E2B SDK's own test suites against a node of this checkout."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from aenv.config import Config
from tests.e2e.conftest import API_KEY, NodeProcess
from tests.support import census
from tests.support.client_ns import client_namespace
from tests.support.host import free_port
from tests.support.tls import make_certs

# With `tls`: the node terminates TLS for this domain with a test CA's wildcard certificate,
# and the suite runs in a network namespace whose resolver answers for it, given nothing but
# E2B_DOMAIN (as an E2B user configures the SDK): the API at https://api.<domain>, each
# sandbox at https://<port>-<id>.<domain>.
DOMAIN = "aenv-sdk.test"


def run_suite(sdk: Path, work: Path, paths: list[str], pytest_args: list[str], *,
              tls: bool = False, **node_env: str) -> int:
    """pytest over `paths` (under the SDK's tests/), with the SDK's own pytest.ini, against a
    node of an instance of its own (released after); its exit code."""
    instance = census.new_instance()
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs",
            "-c", str(sdk / "pytest.ini"), "--rootdir", str(sdk),
            *[str(sdk / "tests" / p) for p in paths], *pytest_args]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env["E2B_API_KEY"] = API_KEY  # and no E2B_DEBUG: debug mode skips the control plane
    # This folder's plugins (`-p aenv_deselect`) by a top-level name: the suites' own tests
    # are a package `tests` too.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                      env.get("PYTHONPATH")]))  # fmt: skip
    with contextlib.ExitStack() as stack:
        # The pools as a node has them by default (the e2e suite's nodes have no primed
        # pool: it would add to the VMs those tests count).
        primed = Config.model_fields["primed_pool_size"].default
        extra = {"AENV_INSTANCE": instance, "AENV_PRIMED_POOL_SIZE": str(primed), **node_env}
        if tls:
            certs = make_certs(work / "certs", DOMAIN)
            ns = stack.enter_context(client_namespace(DOMAIN))
            extra |= {"AENV_HOST": ns.server_ip, "AENV_PORT": "443", "AENV_DOMAIN": DOMAIN,
                      "AENV_TLS_CERT_FILE": str(certs.cert),
                      "AENV_TLS_KEY_FILE": str(certs.key)}  # fmt: skip
            node = NodeProcess(443, work / "server.log", extra_env=extra, probe=lambda: httpx.get(
                f"https://{ns.server_ip}/health", timeout=1,
                verify=certs.by_address()).status_code == 200)  # fmt: skip
            env |= {"E2B_DOMAIN": DOMAIN, "SSL_CERT_FILE": str(certs.ca)}
            argv = ["ip", "netns", "exec", ns.name, *argv]
        else:
            node = NodeProcess(free_port(), work / "server.log", extra_env=extra)
            env |= {"E2B_API_URL": node.origin, "E2B_SANDBOX_URL": node.origin,
                    "E2B_VOLUME_API_URL": node.origin}  # fmt: skip
        node.start()
        try:
            return subprocess.run(argv, env=env, cwd=sdk).returncode
        finally:
            node.stop()
            census.release(instance)
            print(f"server log: {work / 'server.log'}")


def suite_main(argv: list[str], doc: str | None, paths: list[str], args: list[str]) -> int:
    """A runner's `main`: `DIR [--tls] [PYTEST ARGS]`, `args` before the caller's."""
    if not argv:
        print(doc, file=sys.stderr)
        return 2
    rest = argv[1:]
    work = Path(tempfile.mkdtemp(prefix="aenv-sdk-suite-"))
    return run_suite(Path(argv[0]).resolve(), work, paths,
                     [*args, *(a for a in rest if a != "--tls")], tls="--tls" in rest)
