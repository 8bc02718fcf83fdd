"""The template calls trainers make, with the unmodified SDK (issue 31): Harbor 0.26 builds
`name:tag` in the background, reads the tag's build id and creates from `name:<build id>`
(harbor/environments/e2b.py); verifiers builds once, when `exists("<name>:default")` is
false (verifiers/v1/runtimes/e2b.py). The packages themselves run in `make test-long`
(tests/e2e/test_trainers.py)."""

from __future__ import annotations

import time
import uuid

import pytest
from e2b import Sandbox, Template
from e2b.exceptions import SandboxException, TemplateException
from e2b.template.types import BuildInfo

from tests.support.host import DATA_DIR
from tests.support.registry import Seeded, have_tools

from .conftest import NodeProcess, output_in_new_sandbox

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600),
              pytest.mark.skipif(have_tools() is not None, reason=have_tools() or "")]


def _until_built(info: BuildInfo) -> None:
    for _ in range(600):
        status = Template.get_build_status(info).status.value
        if status != "building":
            break
        time.sleep(0.5)
    assert status == "ready", status


def test_a_create_from_name_and_build_id_waits_for_that_build(node: NodeProcess,
                                                              seeded: Seeded) -> None:
    name = f"e2e-harbor-{int(time.time() * 1000) % 10**8}"
    tag = "c1-m512-r5"  # Harbor's resource tag
    with pytest.raises(TemplateException) as e:  # never built: Harbor then builds
        Template.get_tags(name)
    assert e.value.status_code == 404
    assert not Template.exists(f"{name}:default")  # verifiers' question
    info = Template.build_in_background(
        Template().from_image(seeded.multi).run_cmd("echo tagged > /tmp/t.txt", user="root"),
        f"{name}:{tag}")  # fmt: skip
    assert not Template.exists(f"{name}:{tag}")  # not while it builds
    # Created at once from the build id: the create waits for the build (or answers 503
    # with Retry-After, which the SDK's caller retries: Harbor does).
    sbx = None
    for _ in range(20):
        try:
            sbx = Sandbox.create(f"{name}:{info.build_id}", timeout=120)
            break
        except SandboxException as err:
            assert "not ready" in str(err), err
    assert sbx is not None
    try:
        assert Template.get_build_status(info).status.value == "ready"
        assert sbx.commands.run("cat /tmp/t.txt").stdout == "tagged\n"
        tags = Template.get_tags(name)
        assert [(t.tag, str(t.build_id)) for t in tags] == [(tag, info.build_id)]
        assert Template.exists(f"{name}:{tag}") and Template.exists(name)
        assert not Template.exists(f"{name}:other")
        # A build id or tag the template does not have: E2B's words (Harbor reads them as
        # "that build is not ready") and nothing started.
        for ref in (f"{name}:{uuid.uuid4()}", f"{name}:other"):
            with pytest.raises(SandboxException) as e:
                Sandbox.create(ref, timeout=30)
            assert f"does not exist for template '{name}'" in str(e.value), e.value
        with node.api() as c:
            running = [s for s in c.get("/v2/sandboxes").json()
                       if s["templateID"].startswith(name)]  # fmt: skip
            assert [s["sandboxID"] for s in running] == [sbx.sandbox_id]
    finally:
        sbx.kill()
        with node.api() as c:
            assert c.delete(f"/templates/{name}").status_code == 204


def test_concurrent_builds_of_the_same_steps_join_one(node: NodeProcess, seeded: Seeded) -> None:
    """Two trainer processes building one environment at once (each with its own lock):
    the second build joins the first; both end ready, the template carries both tags, and
    either build id creates."""
    name = f"e2e-join-{int(time.time() * 1000) % 10**8}"
    t = Template().from_image(seeded.multi).run_cmd("echo joined > /tmp/j.txt", user="root")
    first = Template.build_in_background(t, f"{name}:a-r5")
    second = Template.build_in_background(t, f"{name}:b-r5")
    try:
        for info in (first, second):
            _until_built(info)
        log = node.log.read_text()
        assert f"build {second.build_id} of {name} joined build {first.build_id}" in log
        assert log.count(f"of {name} started") == 1
        assert sorted(x.tag for x in Template.get_tags(name)) == ["a-r5", "b-r5"]
        for info in (first, second):
            assert output_in_new_sandbox(f"{name}:{info.build_id}", "cat /tmp/j.txt") == \
                "joined\n"  # fmt: skip
    finally:
        with node.api() as c:
            c.delete(f"/templates/{name}")


def test_two_resource_variants_of_one_name_both_create(node: NodeProcess, seeded: Seeded) -> None:
    """Harbor's tag per CPU/memory variant (`c1-…`, `c2-…`) of one environment: the second
    build does not take the first one's tag away; each tag and build id creates a sandbox of
    its own shape, the listing of tags shows both, and deleting the template removes both
    builds' snapshots."""
    name = f"e2e-variants-{int(time.time() * 1000) % 10**8}"
    t = Template().from_image(seeded.multi).run_cmd("echo variant > /tmp/v.txt", user="root")
    built = {}
    for cpus in (1, 2):
        info = Template.build_in_background(t, f"{name}:c{cpus}-m512-r5", cpu_count=cpus,
                                            memory_mb=512)  # fmt: skip
        _until_built(info)
        built[cpus] = info.build_id
    ours = sorted(p for p in (DATA_DIR / "snapshots").glob(f"tpl-{name}-*"))
    try:
        assert len(ours) == 2, ours  # both builds' snapshots
        assert sorted((x.tag, str(x.build_id)) for x in Template.get_tags(name)) == [
            ("c1-m512-r5", built[1]), ("c2-m512-r5", built[2])]
        assert Template.exists(f"{name}:c1-m512-r5") and Template.exists(f"{name}:c2-m512-r5")
        for cpus in (1, 2):
            for ref in (f"{name}:c{cpus}-m512-r5", f"{name}:{built[cpus]}"):
                assert output_in_new_sandbox(ref, "nproc; cat /tmp/v.txt") == \
                    f"{cpus}\nvariant\n", ref  # fmt: skip
    finally:
        with node.api() as c:
            assert c.delete(f"/templates/{name}").status_code == 204
    assert [p for p in ours if p.exists()] == []
