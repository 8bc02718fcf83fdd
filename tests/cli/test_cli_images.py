"""`aenv template build NAME -f Dockerfile [CONTEXT]` through the node's build API, as a user
runs it: no root needed by the command itself, the build log streams, errors are one line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.image_state import removed_after
from tests.support.registry import Seeded, have_tools, seeded_registry

from .conftest import Node, assert_one_line_error

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(have_tools() is not None, reason=have_tools() or "")]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    with removed_after(), seeded_registry(tmp_path_factory.mktemp("registry")) as s:
        yield s


def test_a_dockerfile_builds_through_the_api(vm_node: Node, seeded: Seeded,
                                             tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    (tmp_path / "app/a.txt").write_text("copied\n")
    (tmp_path / "Dockerfile").write_text(
        f"FROM {seeded.sibling}\n"
        "COPY app /srv/app\n"
        "RUN echo built > /srv/built.txt\n"
        "ENV GREETING=hi\n"
        "WORKDIR /srv/app\n"
        "USER user\n"
    )
    p = vm_node.cli("template", "build", "cli-df", "-f", str(tmp_path / "Dockerfile"),
                    str(tmp_path), timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "cli-df"
    assert "RUN echo built" in p.stderr and "is ready" in p.stderr  # the log streamed
    p = vm_node.cli("start", "-d", "cli-df", "--timeout", "120")
    assert p.returncode == 0, p.stderr
    sid = p.stdout.strip()
    try:
        p = vm_node.cli("exec", sid, 'cat a.txt /srv/built.txt; echo "$GREETING"; whoami; pwd')
        assert p.stdout.split() == ["copied", "built", "hi", "user", "/srv/app"], p.stderr
    finally:
        vm_node.cli("rm", sid)

    # `template ls` shows its bytes and how many it shares (its snapshot is a clone of its
    # base's); `template rm` goes through the API, which keeps the default template.
    p = vm_node.cli("template", "ls", "--json")
    row = next(t for t in json.loads(p.stdout) if t["templateID"] == "cli-df")
    assert 0 < row["sharedBytes"] < row["sizeBytes"], row
    p = vm_node.cli("template", "ls", "--table", env={"COLUMNS": "250"})
    assert "SHARED" in p.stdout.splitlines()[0], p.stdout
    p = vm_node.cli("template", "rm", "cli-df")
    assert (p.returncode, p.stdout, p.stderr) == (0, "cli-df\n", "")
    assert_one_line_error(vm_node.cli("template", "rm", "cli-df"), "no such template: cli-df")
    assert_one_line_error(vm_node.cli("template", "rm", "base"), "default template")


def test_dockerfile_errors_are_one_line(vm_node: Node, seeded: Seeded, tmp_path: Path) -> None:
    assert_one_line_error(vm_node.cli("template", "build", "x", "-f", str(tmp_path / "nope")),
                          "no such Dockerfile")  # fmt: skip
    df = tmp_path / "Dockerfile"
    df.write_text(f"FROM {seeded.sibling}\nRUN echo about to fail; exit 7\n")
    p = vm_node.cli("template", "build", "cli-broken", "-f", str(df), timeout=600)
    assert p.returncode == 1, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("aenv: building cli-broken failed") and "exit code 7" in last, last
    assert "Traceback" not in p.stderr
    assert vm_node.cli("template", "ls").stdout.count("cli-broken") == 0
