"""OCI images as templates, end to end: `aenv pull` from a real registry on loopback, then
the unmodified E2B SDK runs commands in a sandbox of that template. The image is busybox
only (no bash, no Python, no glibc) with a whiteout, an opaque directory, a hardlink, a
setuid file, an xattr and an owner, and a config (Env, WorkingDir, User) that becomes the
sandbox's defaults."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox

from aenv.machines import guest_trust
from tests.support.host import DATA_DIR
from tests.support.image_state import removed_after
from tests.support.registry import Seeded, have_tools

from .conftest import NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600),
              pytest.mark.skipif(have_tools() is not None, reason=have_tools() or "")]
AENV = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "aenv")
# The guest's own Python, from the tools drive (the image has none), to read an xattr.
GUEST_PY = ("PYTHONHOME=/.aenv/python /.aenv/lib/ld-linux-x86-64.so.2 --library-path "
            "/.aenv/lib /.aenv/python/bin/python3 -c")  # fmt: skip


def aenv(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AENV_DATA_DIR": str(DATA_DIR)}
    return subprocess.run([AENV, *args], env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)  # fmt: skip


@pytest.fixture
def template_name() -> Iterator[str]:
    with removed_after():  # the template, and the snapshot it made
        yield f"e2e-img-{secrets.token_hex(3)}"


def _check_multi(template: str) -> None:
    """A sandbox of `seeded.multi`'s template sees its config and every case of its layers."""
    sbx = Sandbox.create(template, timeout=300)
    try:
        r = sbx.commands.run('id -un; pwd; echo "$FOO"')
        assert r.stdout.split() == ["user", "/work", "bar"], r.stdout
        checks = [
            "test ! -e /etc/gone && echo whiteout-ok",
            "ls /opt/data",
            "stat -c '%i %h %u:%g' /srv/a",
            "stat -c '%i %h' /srv/b",
            "stat -c '%a' /srv/suid",
            f"{GUEST_PY} 'import os; print(os.getxattr(\"/srv/x\", \"user.aenv\").decode())'",
            "readlink /srv/link",
        ]
        out = sbx.commands.run("; ".join(checks), user="root").stdout.splitlines()
        assert out[0] == "whiteout-ok"
        assert out[1] == "new"
        ino, nlink, owner = out[2].split()
        assert out[3].split() == [ino, "2"] and (nlink, owner) == ("2", "123:456")
        assert out[4] == "4755"
        assert out[5] == "ok"
        assert out[6] == "/etc/passwd"
        sbx.files.write("/work/hello.txt", "hi")
        assert sbx.commands.run("cat hello.txt; echo; stat -c %U hello.txt").stdout.split() == [
            "hi", "user"]
    finally:
        sbx.kill()


def test_a_pulled_image_runs_as_user_with_its_config_and_layers(
        node: NodeProcess, seeded: Seeded, template_name: str) -> None:
    p = aenv("pull", seeded.multi, "--name", template_name)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == template_name
    assert "layer" in p.stderr  # progress per layer
    _check_multi(template_name)
    # A second pull of the same image is answered from the caches.
    p = aenv("pull", seeded.multi, "--name", template_name)
    assert p.returncode == 0, p.stderr
    assert "up to date" in p.stderr


def test_a_pull_that_fails_says_why_in_one_line_and_leaves_no_template(
        node: NodeProcess, seeded: Seeded, template_name: str) -> None:
    host = seeded.registry.host
    for ref, why in [(f"{host}/test/multi:no-such-tag", "manifest unknown"),
                     ("127.0.0.1:1/test/multi:1", "connection refused"),
                     ("Not/A:Reference", "lowercase")]:  # fmt: skip
        p = aenv("pull", ref, "--name", template_name)
        assert p.returncode == 1, p.stderr
        lines = p.stderr.strip().splitlines()
        assert lines[-1].startswith("aenv: ") and why in lines[-1], p.stderr
        assert "Traceback" not in p.stderr
        assert not (DATA_DIR / "templates" / template_name).exists()
    leftovers = [q.name for q in (DATA_DIR / "templates").iterdir() if template_name in q.name]
    assert leftovers == []


def test_a_start_command_is_running_in_every_sandbox_of_the_template(
        node: NodeProcess, seeded: Seeded, template_name: str) -> None:
    start = ["--start-cmd", "sh -c 'echo $$ > /tmp/started; exec sleep 100000'",
             "--ready-cmd", "test -s /tmp/started"]  # fmt: skip
    p = aenv("pull", seeded.sibling, "--name", template_name, *start)
    assert p.returncode == 0, p.stderr
    assert "Waiting for: test -s /tmp/started" in p.stderr
    probe = 'kill -0 "$(cat /tmp/started)" && echo running'
    for _ in range(2):  # each sandbox has the process of the snapshot, not one of its own
        sbx = Sandbox.create(template_name, timeout=120)
        try:
            assert sbx.commands.run(probe).stdout == "running\n"
        finally:
            sbx.kill()
    p = aenv("pull", seeded.sibling, "--name", template_name, *start)
    assert p.returncode == 0 and "up to date" in p.stderr, p.stderr
    # Without it the template is made again, with no process of its own.
    p = aenv("pull", seeded.sibling, "--name", template_name)
    assert p.returncode == 0 and "up to date" not in p.stderr, p.stderr
    sbx = Sandbox.create(template_name, timeout=120)
    try:
        assert sbx.commands.run("test -e /tmp/started || echo none").stdout == "none\n"
    finally:
        sbx.kill()
    p = aenv("pull", seeded.sibling, "--name", template_name, "--ready-cmd", "true")
    assert p.returncode == 1 and p.stderr.strip() == "aenv: --ready-cmd needs --start-cmd"


@pytest.mark.long  # ~30 s
def test_an_image_that_extends_a_templates_image_is_made_on_that_template(
        node: NodeProcess, seeded: Seeded, template_name: str) -> None:
    lower = f"{template_name}-lower"
    assert aenv("pull", seeded.base, "--name", lower).returncode == 0
    p = aenv("pull", seeded.multi, "--name", template_name)
    assert p.returncode == 0, p.stderr
    assert f"1 of its 3 layers are template {lower}'s: making it on that one" in p.stderr
    assert "unpacking" not in p.stderr and "booting" not in p.stderr  # no disk, no cold boot
    _check_multi(template_name)
    with node.api() as c:
        t = next(t for t in c.get("/templates").json() if t["templateID"] == template_name)
    assert t["sharedBytes"] > 0.5 * t["sizeBytes"], t  # mostly the lower template's extents
    p = aenv("pull", seeded.multi, "--name", template_name)
    assert p.returncode == 0 and "up to date" in p.stderr, p.stderr
    # The lower template can go: the one made on it has its own (reflinked) files.
    with node.api() as c:
        assert c.delete(f"/templates/{lower}").status_code == 204
    sbx = Sandbox.create(template_name, timeout=120)
    try:
        assert sbx.commands.run("cat /opt/data/new").stdout == "new"
    finally:
        sbx.kill()


def test_a_sandbox_with_rules_trusts_the_egress_ca_in_a_busybox_image(
        node: NodeProcess, seeded: Seeded, template_name: str) -> None:  # fmt: skip
    """The image has no certificate store at all: the trust step makes one."""
    p = aenv("pull", seeded.multi, "--name", template_name)
    assert p.returncode == 0, p.stderr
    rules = {"api.example.test": [{"transform": {"headers": {"X-A": "b"}}}]}
    sbx = Sandbox.create(template_name, timeout=120, network={"rules": rules})
    try:
        ca = (DATA_DIR / "egress-ca.pem").read_text().strip()
        store = sbx.commands.run(f"cat {guest_trust.BUNDLE}", user="root").stdout
        assert ca in store
        anchor = sbx.commands.run(f"cat {guest_trust.ANCHOR}", user="root").stdout
        assert anchor.strip() == ca
        env = sbx.commands.run('echo "$SSL_CERT_FILE $REQUESTS_CA_BUNDLE $NODE_EXTRA_CA_CERTS"')
        assert env.stdout.split() == [guest_trust.BUNDLE, guest_trust.BUNDLE,
                                      guest_trust.ANCHOR]  # fmt: skip
    finally:
        sbx.kill()
