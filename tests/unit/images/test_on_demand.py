"""What counts as an image reference in a create, and which registries a node pulls from
(images/on_demand.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aenv.config import Config
from aenv.images.on_demand import OnDemandImages, allowed
from aenv.images.reference import has_registry, parse
from aenv.orchestrator.errors import Forbidden, InvalidRequest
from aenv.orchestrator.pending import PendingTemplates


@pytest.mark.parametrize(("text", "image"), [
    ("ghcr.io/org/env:1", True),
    ("127.0.0.1:5000/x", True),
    ("localhost/aenv/base-minimal", True),
    ("x@sha256:" + "0" * 64, True),
    ("base", False),
    ("ubuntu:22.04", False),  # a template name first (short names are the operator's call)
    ("team/name", False),  # no dot, colon or localhost in the first part: not a host
    ("harbor-0123abcd:c1-m512-r5", False),
])  # fmt: skip
def test_an_image_has_a_registry_host_or_a_digest(text: str, image: bool) -> None:
    assert has_registry(text) is image


@pytest.mark.parametrize(("entries", "ref", "ok"), [
    (["*"], "evil.example/x:1", True),
    (["docker.io"], "ubuntu:22.04", True),  # Docker Hub's, normalized
    (["docker.io"], "ghcr.io/org/x:1", False),
    (["127.0.0.1"], "127.0.0.1:5000/x:1", True),  # a host: any port
    (["127.0.0.1:5000"], "127.0.0.1:5001/x:1", False),
    (["ghcr.io/org"], "ghcr.io/org/env:1", True),  # a repository prefix
    (["ghcr.io/org"], "ghcr.io/org/team/env:1", True),
    (["ghcr.io/org"], "ghcr.io/organ/env:1", False),  # a prefix ends at a slash
    (["ghcr.io/org"], "ghcr.io/other/env:1", False),
    ([], "docker.io/library/ubuntu:22.04", False),
])  # fmt: skip
def test_the_registries_a_node_pulls_from(entries: list[str], ref: str, ok: bool) -> None:
    assert allowed(entries, parse(ref)) is ok


def test_a_teams_own_list_replaces_the_nodes_for_its_creates_and_builds(tmp_path: Path) -> None:
    own = {"t-ghcr": ("ghcr.io/org",), "t-none": ()}
    images = OnDemandImages(Config(data_dir=tmp_path, image_registries=["docker.io"]), None,
                            PendingTemplates(1), own.get)  # fmt: skip
    assert str(images.check("ubuntu:22.04")) == "docker.io/library/ubuntu:22.04"
    assert str(images.check("ubuntu:22.04", "t-other"))  # a team without a list: the node's
    assert str(images.check("ghcr.io/org/env:1", "t-ghcr")) == "ghcr.io/org/env:1"
    with pytest.raises(Forbidden, match="the team may pull from"):
        images.check("ubuntu:22.04", "t-ghcr")  # the node's list is not the team's
    with pytest.raises(Forbidden, match="the team may pull from"):
        images.check("ghcr.io/org/env:1", "t-none")  # an empty list: nothing
    with pytest.raises(Forbidden, match="this node pulls from"):
        images.check("ghcr.io/org/env:1")
    with pytest.raises(InvalidRequest):
        images.check("Not A Ref", "t-ghcr")
