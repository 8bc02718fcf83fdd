"""First contact: `aenv server`, once it serves, prints its URL, where its key is and the
lines an E2B client needs; those very lines, run in a shell, point the unmodified SDK at it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from aenv.api.welcome import first_contact
from aenv.config import Config

from .conftest import Node, _node


def _banner(node: Node) -> list[str]:
    deadline = time.monotonic() + 10
    while "E2B_API_KEY" not in (text := node.log.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"no first-contact lines:\n{node.tail()}"
        time.sleep(0.1)
    return [ln for ln in text.splitlines() if ln.startswith(("aenv server:", "API key:", "  "))]


def test_the_server_says_how_an_e2b_client_reaches_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    data = tmp_path_factory.mktemp("first-contact")
    node = _node(tmp_path_factory, "first", AENV_RUNTIME="fake", AENV_DATA_DIR=str(data))
    del node.server_env["AENV_API_KEY"]  # as after `make run`: the key it generates
    node.start()
    try:
        lines = _banner(node)
        key_file = data / "api_key"
        assert lines[:2] == [f"aenv server: serving the E2B API at {node.url}",
                             f"API key: in {key_file}"]  # fmt: skip
        exports = [ln.strip() for ln in lines if ln.startswith("  export ")]
        assert exports == [f"export E2B_API_URL={node.url}", f"export E2B_SANDBOX_URL={node.url}",
                           f"export E2B_VOLUME_API_URL={node.url}",
                           f"export E2B_API_KEY=$(cat {key_file})"]  # fmt: skip
        sdk = ("from e2b import Sandbox, Volume; s = Sandbox.create(timeout=60); "
               "print(s.sandbox_id in [x.sandbox_id for x in Sandbox.list().next_items()]); "
               "s.kill(); v = Volume.create(\"first\"); v.write_file(\"/f\", \"ok\"); "
               "print(v.read_file(\"/f\")); Volume.destroy(v.volume_id)")  # fmt: skip
        env = {k: v for k, v in node.server_env.items() if not k.startswith("AENV_")}
        r = subprocess.run(["bash", "-c", "; ".join([*exports, f"{sys.executable} -c '{sdk}'"])],
                           env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0 and r.stdout.split() == ["True", "ok"], r.stderr[-2000:]
    finally:
        assert node.stop() == 0, node.tail()


def test_the_lines_for_a_key_from_the_environment_and_for_a_domain_over_tls(
    tmp_path: Path,
) -> None:
    cfg = Config(data_dir=tmp_path, api_key="k", host="0.0.0.0", port=8443)
    assert first_contact(cfg).splitlines() == [
        "aenv server: serving the E2B API at http://127.0.0.1:8443", "API key: from AENV_API_KEY",
        "An E2B client (Python or JS SDK, e2b CLI) reaches it with:",
        "  export E2B_API_URL=http://127.0.0.1:8443", "  export E2B_SANDBOX_URL=http://127.0.0.1:8443",
        "  export E2B_VOLUME_API_URL=http://127.0.0.1:8443",
        "  export E2B_API_KEY=$AENV_API_KEY"]  # fmt: skip
    (tmp_path / "c.pem").write_text("x")
    (tmp_path / "k.pem").write_text("x")
    tls = Config(data_dir=tmp_path, api_key="k", domain="sbx.test", port=443,
                 tls_cert_file=tmp_path / "c.pem", tls_key_file=tmp_path / "k.pem",
                 public_url="https://api.sbx.test")  # fmt: skip
    lines = first_contact(tls).splitlines()
    assert lines[0] == "aenv server: serving the E2B API at https://api.sbx.test"
    assert [ln.strip() for ln in lines if "export" in ln] == [
        "export E2B_DOMAIN=sbx.test", "export E2B_API_KEY=$AENV_API_KEY"]
