"""E2B template builds with the unmodified SDK: `Template.build` FROM an image on a local
registry, with COPY of a directory, RUN, ENV, WORKDIR and USER; the step cache on a rebuild;
and failures that name their step."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException

from aenv.images.reference import parse
from aenv.storage.templates import TemplateCatalog, TemplateMissing
from tests.support.host import DATA_DIR
from tests.support.image_state import removed_after
from tests.support.registry import Seeded, have_tools

from .conftest import NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900),
              pytest.mark.skipif(have_tools() is not None, reason=have_tools() or "")]


@pytest.fixture
def context(tmp_path: Path) -> Path:
    (tmp_path / "app/sub").mkdir(parents=True)
    (tmp_path / "app/a.txt").write_text("from the context\n")
    (tmp_path / "app/sub/b.txt").write_text("nested\n")
    (tmp_path / "app/link").symlink_to("a.txt")
    return tmp_path


def _template(seeded: Seeded, context: Path, last: str) -> Template:
    return (Template(file_context_path=str(context))
            .from_image(seeded.multi)
            .copy("app", "/srv/app")
            .run_cmd("echo built > /srv/built.txt", user="root")
            .set_envs({"GREETING": "hello"})
            .set_workdir("/srv/app")
            .set_user("user")
            .run_cmd(last))  # fmt: skip


def test_a_dockerfile_like_build_and_its_step_cache(node: NodeProcess, seeded: Seeded,
                                                   context: Path) -> None:
    name = f"e2e-build-{int(time.time() * 1000) % 10**8}"
    logs: list[str] = []
    t0 = time.monotonic()
    Template.build(_template(seeded, context, "echo $GREETING > mine.txt"), name,
                   on_build_logs=lambda e: logs.append(e.message))  # fmt: skip
    cold = time.monotonic() - t0
    assert Template.exists(name)
    sbx = Sandbox.create(name, timeout=120)
    try:
        r = sbx.commands.run("cat a.txt sub/b.txt /srv/built.txt mine.txt; readlink link; "
                             "echo $GREETING; pwd; whoami; stat -c %U a.txt")  # fmt: skip
        assert r.stdout.split("\n")[:-1] == ["from the context", "nested", "built", "hello",
                                             "a.txt", "hello", "/srv/app", "user", "user"]
    finally:
        sbx.kill()

    # Only the last step changed: everything before it comes from the step cache.
    logs.clear()
    t0 = time.monotonic()
    Template.build(_template(seeded, context, "echo changed > mine.txt"), name,
                   on_build_logs=lambda e: logs.append(e.message))  # fmt: skip
    warm = time.monotonic() - t0
    cached = [m for m in logs if m.startswith("CACHED")]
    assert len(cached) == 5, logs
    print(f"cold build {cold:.1f} s, rebuild with the last step changed {warm:.1f} s "
          f"({warm / cold:.2f}x)")
    sbx = Sandbox.create(name, timeout=120)
    try:
        assert sbx.commands.run("cat mine.txt").stdout == "changed\n"
        # Deleting the template: gone for new sandboxes, kept by the ones made from it.
        with node.api() as c:
            assert c.delete(f"/templates/{name}").status_code == 204
            assert c.delete(f"/templates/{name}").status_code == 404
            r = c.delete("/templates/base")
            assert r.status_code == 400 and "default template" in r.json()["message"]
        assert not Template.exists(name)
        assert sbx.commands.run("cat mine.txt").stdout == "changed\n"
    finally:
        sbx.kill()


def test_a_failing_step_names_itself_and_leaves_no_template(node: NodeProcess, seeded: Seeded,
                                                           context: Path) -> None:
    name = f"e2e-broken-{int(time.time() * 1000) % 10**8}"
    t = (Template(file_context_path=str(context)).from_image(seeded.multi)
         .run_cmd("echo step-one").run_cmd("echo about to fail; exit 3"))  # fmt: skip
    with pytest.raises(BuildException) as e:
        Template.build(t, name)
    assert "exit code 3" in str(e.value) and "about to fail" in str(e.value)
    assert not Template.exists(name)

    t = Template().from_image(seeded.multi).run_cmd("whoami", user="root123")
    with pytest.raises(BuildException) as e:
        Template.build(t, name)
    assert ("failed to run command 'whoami': command failed: unauthenticated: invalid "
            "username: 'root123'") in str(e.value)

    with pytest.raises(BuildException) as e:
        Template.build(Template().from_image(f"{seeded.registry.host}/test/none:1"), name)
    assert "manifest unknown" in str(e.value)
    assert not Template.exists(name)


@pytest.mark.parametrize("image", [  # e2bdev/base (the familiar template, ~60 s): test-long
    "localhost/aenv/base-minimal", pytest.param("e2bdev/base", marks=pytest.mark.long)])
def test_a_build_from_the_nodes_own_base_image_starts_from_its_template(
        node: NodeProcess, image: str) -> None:
    """`aenv setup` exports the minimal Debian as `localhost/aenv/base-minimal`, and the
    familiar base as `e2bdev/base` (not under --minimal-base, as in CI): a build FROM either
    asks no registry and starts from the template it was exported from (no unpack, no cold
    boot), and its sandboxes keep that template's Debian."""
    rec = json.loads((DATA_DIR / "images/local.json").read_text()).get(str(parse(image)))
    try:  # exported from the template as it is now (not a template since rebuilt)
        current = rec is not None and TemplateCatalog(DATA_DIR / "templates").get(
            rec["template"]).snapshot_id == rec["snapshot_id"]  # fmt: skip
    except TemplateMissing:
        current = False
    if not current:
        pytest.skip(f"{image} is not exported here (aenv setup --minimal-base)")
    name = f"e2e-own-base-{int(time.time() * 1000) % 10**8}"
    logs: list[str] = []
    with removed_after():
        before = {p.name for p in (DATA_DIR / "templates").iterdir()}
        t = (Template().from_base_image() if image == "e2bdev/base"
             else Template().from_image(image))  # fmt: skip
        Template.build(t.run_cmd("echo own > /home/user/own.txt"), name,
                       on_build_logs=lambda e: logs.append(e.message))  # fmt: skip
        assert any("own image: the build starts from it" in m for m in logs), logs
        # No `image-…` template was made of it: the build started from the exported one.
        made = {p.name for p in (DATA_DIR / "templates").iterdir()} - before
        assert made == {name}, made
        sbx = Sandbox.create(name, timeout=120)
        try:
            r = sbx.commands.run("cat own.txt; . /etc/os-release; echo $ID; whoami")
            assert r.stdout.split() == ["own", "debian", "user"]
            if image == "e2bdev/base":  # what E2B's base image gives
                # Node.js under TCG: V8's first start translates much (a minute and more).
                r = sbx.commands.run("pip --version && node --version && npm --version && "
                                     "gcc --version && python --version", timeout=600)  # fmt: skip
                assert r.exit_code == 0
        finally:
            sbx.kill()
