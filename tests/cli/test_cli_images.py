"""`aenv template build NAME -f Dockerfile [CONTEXT]` through the node's build API, as a user
runs it: no root needed by the command itself, the build log streams, errors are one line."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.image_state import removed_after
from tests.support.registry import Seeded, have_tools, seeded_registry

from .conftest import AENV, Node, assert_one_line_error

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


def test_ctrl_c_cancels_the_build(vm_node: Node, seeded: Seeded, tmp_path: Path) -> None:
    df = tmp_path / "Dockerfile"
    df.write_text(f"FROM {seeded.sibling}\nRUN sleep 600\n")
    p = subprocess.Popen([AENV, "template", "build", "cli-cancel", "-f", str(df)],
                         env=vm_node.cli_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            lines.append(line.rstrip("\n"))
            if "RUN sleep 600" in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(300), lines
        p.send_signal(signal.SIGINT)
        assert p.wait(60) == 130, lines
    finally:
        if p.poll() is None:
            p.kill()
    reader.join(10)
    assert lines[-1] == "aenv: interrupted: the build of cli-cancel was cancelled", lines
    created = [m for ln in lines if (m := re.search(r"ID: (\S+), Build ID: (\S+)", ln))]
    assert created, lines
    tid, bid = created[-1].groups()
    with vm_node.api() as c:
        status = c.get(f"/templates/{tid}/builds/{bid}/status").json()
        assert (status["status"], status["reason"]["message"]) == (
            "error", "the build was cancelled"), status
        assert c.get("/templates/cli-cancel").status_code == 404
