"""E2B's desktop SDK (`e2b-desktop`, unmodified) against the `desktop` template (made first
if this host has not: `aenv setup -t desktop`): the create finds the desktop running,
screenshots are PNGs of the screen's size, the mouse and keyboard act (a terminal typed into
writes a file), and the noVNC stream answers through the node's proxy."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b.sandbox.commands.command_handle import CommandExitException
from e2b_desktop import Sandbox

from .conftest import DATA_DIR, NodeProcess, running_node

pytestmark = [pytest.mark.e2e, pytest.mark.long, pytest.mark.timeout(1800)]
TEMPLATE = "desktop"


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    width, height = struct.unpack(">II", data[16:24])  # IHDR's first fields
    return width, height


def _windows(desk: Sandbox, application: str) -> list[str]:
    try:
        return desk.get_application_windows(application)
    except CommandExitException:  # xdotool found none
        return []


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    if not (DATA_DIR / "templates" / TEMPLATE / "template.json").exists():
        subprocess.run([sys.executable, "-m", "aenv.cli.main", "setup", "-t", TEMPLATE],
                       check=True, timeout=1500)  # fmt: skip
    with running_node(tmp_path_factory.mktemp("node")) as n:
        yield n


def test_the_sdk_drives_the_desktop(node: NodeProcess) -> None:
    t0 = time.monotonic()
    desk = Sandbox.create(timeout=600)  # the SDK's default template: `desktop`
    try:
        print(f"Sandbox.create() with the desktop up: {time.monotonic() - t0:.1f} s")
        before = desk.screenshot()
        assert _png_size(before) == (1024, 768) == desk.get_screen_size()
        desk.move_mouse(300, 200)
        assert desk.get_cursor_position() == (300, 200)
        desk.commands.run("xfce4-terminal --geometry=80x20+100+100 >/dev/null 2>&1 &")
        deadline = time.monotonic() + 120
        while not _windows(desk, "xfce4-terminal"):
            assert time.monotonic() < deadline, "no terminal window"
            time.sleep(1)
        time.sleep(2)
        desk.left_click(300, 200)  # into the terminal: it has the focus
        desk.write("echo typed > /tmp/typed")
        desk.press("enter")
        deadline = time.monotonic() + 60
        while desk.commands.run("cat /tmp/typed 2>/dev/null || true").stdout.strip() != "typed":
            assert time.monotonic() < deadline, "what was typed did not run"
            time.sleep(1)
        after = desk.screenshot()
        assert _png_size(after) == (1024, 768) and after != before
        desk.stream.start()
        url = desk.stream.get_url()
        assert url.startswith(f"https://6080-{desk.sandbox_id}.") and "/vnc.html" in url
        page = httpx.get(f"{node.origin}/vnc.html", timeout=30, headers={
            "E2b-Sandbox-Id": desk.sandbox_id, "E2b-Sandbox-Port": "6080"})  # fmt: skip
        assert page.status_code == 200 and "noVNC" in page.text, page.text[:300]
        desk.stream.stop()
    finally:
        desk.kill()
