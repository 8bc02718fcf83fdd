"""Sandboxes from image references, on demand (issue 31; images/on_demand.py), with the
unmodified SDK against a node: a create by reference and one by the operator's metadata key,
each twice at once, make one pull each and run that image; a reference outside
`image_registries` (a create, or a build's fromImage) gets 403 and pulls nothing; and with
Docker Hub short names allowed, `ubuntu:22.04` is a template of that name when one exists,
else the image (a loopback mirror stands in for Docker Hub)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from e2b import Sandbox, Template
from e2b.exceptions import BuildException, SandboxException

from tests.support.registry import Seeded, have_tools

from .conftest import NodeProcess, output_in_new_sandbox, running_node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900),
              pytest.mark.skipif(have_tools() is not None, reason=have_tools() or "")]


@pytest.fixture(scope="module")
def images_node(tmp_path_factory: pytest.TempPathFactory, seeded: Seeded
                ) -> Iterator[NodeProcess]:  # fmt: skip
    with running_node(tmp_path_factory.mktemp("node"), AENV_IMAGE_METADATA_KEY="image",
                      AENV_IMAGE_REGISTRIES="127.0.0.1,docker.io", AENV_IMAGE_SHORT_NAMES="1",
                      AENV_REGISTRY_MIRRORS=f"docker.io=http://{seeded.registry.host}",
                      ) as n:  # fmt: skip
        yield n


def _pulls(node: NodeProcess, ref: str) -> int:
    return len(re.findall(rf"image {re.escape(ref)}: pulling ", node.log.read_text()))


def _twice(**create: object) -> list[Sandbox]:
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda _: Sandbox.create(timeout=120, **create), range(2)))


def test_an_image_reference_and_a_metadata_key_each_pull_once(images_node: NodeProcess,
                                                              seeded: Seeded) -> None:
    by_ref = _twice(template=seeded.multi)
    by_key = _twice(metadata={"image": seeded.sibling})
    try:
        for s in by_ref:  # multi's opaque directory holds `new`
            assert s.commands.run("cat /opt/data/new").stdout == "new"
        for s in by_key:  # sibling's own layer
            assert s.commands.run("cat /sibling").stdout == "own"
        assert _pulls(images_node, seeded.multi) == 1
        assert _pulls(images_node, seeded.sibling) == 1
        # later creates reuse its template: no pull
        again = Sandbox.create(seeded.multi, timeout=60)
        again.kill()
        assert _pulls(images_node, seeded.multi) == 1
    finally:
        for s in by_ref + by_key:
            s.kill()


def test_a_reference_outside_the_allowlist_is_403_and_pulls_nothing(
        images_node: NodeProcess, tmp_path: Path) -> None:
    for ref in ("ghcr.io/org/agent:1", "10.9.8.7:5000/x@sha256:" + "0" * 64):
        with pytest.raises(SandboxException) as e:
            Sandbox.create(ref, timeout=30)
        assert "403" in str(e.value) and "image_registries" in str(e.value), e.value
        with pytest.raises(SandboxException) as e:
            Sandbox.create(metadata={"image": ref}, timeout=30)
        assert "403" in str(e.value)
    with pytest.raises(BuildException) as b:
        Template.build(Template().from_image("ghcr.io/org/agent:1"), f"e2e-deny-{time.time_ns()}")
    assert "403" in str(b.value) and "image_registries" in str(b.value)
    assert not re.search(r"image (ghcr\.io|10\.9\.8\.7)\S*: pulling", images_node.log.read_text())
    with images_node.api() as c:
        assert not [t for t in c.get("/templates").json() if "ghcr" in str(t)]


def test_a_template_name_wins_over_a_docker_hub_short_name(images_node: NodeProcess,
                                                            seeded: Seeded) -> None:
    # No template named `ubuntu`: Docker Hub's ubuntu:22.04 (the mirror's: sibling's layers)
    s = Sandbox.create("ubuntu:22.04", timeout=60)
    try:
        assert s.commands.run("cat /sibling").stdout == "own"
    finally:
        s.kill()
    # A template `ubuntu` tagged 22.04 now exists: the same name is the template
    Template.build(Template().from_image(seeded.multi).run_cmd("echo mine > /tmp/mine"),
                   "ubuntu:22.04")  # fmt: skip
    try:
        assert output_in_new_sandbox("ubuntu:22.04", "cat /tmp/mine") == "mine\n"
    finally:
        with images_node.api() as c:
            assert c.delete("/templates/ubuntu").status_code == 204
