"""The web console against a node with real VMs, in a real headless Chromium, beside the
unmodified SDK: keys (wrong, revoked mid-session, another team's, not an admin's), pause and
resume from the page seen by the SDK, and a sandbox's own page kept from the console's key.
tests/integration/console/ covers what needs no VM (CORS, layout, keyboard, a silent node)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, SandboxState
from playwright.sync_api import Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from aenv.config import Config
from tests.e2e.conftest import API_KEY, NodeProcess, free_port, running_node
from tests.support.browser import (  # noqa: F401
    act,
    browser_fixture,
    log_in,
    open_console,
    page_fixture,
    row,
    screenshot,
)
from tests.support.image_state import removed_after

SERVED_PORT = 8080


@dataclass
class Console:
    node: NodeProcess
    origin: str

    def admin(self) -> httpx.Client:
        return self.node.api()


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    port = free_port()
    with running_node(tmp_path_factory.mktemp("node"), AENV_CONSOLE_PORT=str(port)) as n:
        _pool_filled(n)
        yield Console(n, f"http://127.0.0.1:{port}")


def _pool_filled(n: NodeProcess, deadline_s: float = 90) -> None:
    """Until the node's warm pool is full: filling it adds interfaces to the host, and
    Chromium aborts page loads when they change (`open_console`)."""
    want = Config.model_fields["warm_pool_size"].default
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        m = re.search(r'^aenv_pooled_vms\{kind="warm_pool"\} (\S+)$',
                      httpx.get(n.origin + "/metrics", timeout=10).text, re.M)  # fmt: skip
        if m and float(m.group(1)) >= want:
            return
        time.sleep(0.5)
    pytest.fail(f"the node's warm pool did not fill in {deadline_s:.0f} s")


@pytest.fixture
def sbx(console: Console) -> Iterator[Sandbox]:
    """A sandbox of `base` made with the SDK, killed after (if the test did not)."""
    s = Sandbox.create("base", timeout=300, metadata={"from": "console-test"})
    try:
        yield s
    finally:
        with contextlib.suppress(Exception):
            s.kill()


@contextlib.contextmanager
def team_key(c: Console, admin: bool = False) -> Iterator[tuple[str, str]]:
    """A new team and a key of it: (the key, its id); both removed after."""
    with c.admin() as api:
        team = api.post("/admin/teams", json={"name": "console-" + os.urandom(3).hex()})
        assert team.status_code == 201, team.text
        tid = team.json()["teamID"]
        made = api.post("/admin/keys", json={"team": tid, "name": "console", "admin": admin})
        assert made.status_code == 201, made.text
        try:
            yield made.json()["key"], made.json()["keyID"]
        finally:
            api.delete(f"/admin/keys/{made.json()['keyID']}")
            assert api.delete(f"/admin/teams/{tid}").status_code == 204


def test_a_wrong_key_and_a_key_revoked_mid_session(console: Console, page: Page) -> None:
    open_console(page, console.origin + "/")
    page.fill("#key", "not-a-key")
    page.press("#key", "Enter")
    expect(page.locator("#login-message")).to_have_text("That key was refused: Invalid API key.")
    screenshot(page, "login-refused")
    with team_key(console) as (key, key_id):
        log_in(page, console.origin, key)
        expect(page.locator("#sandboxes")).to_contain_text("No sandboxes.")
        with console.admin() as api:
            assert api.delete(f"/admin/keys/{key_id}").status_code == 204
        # The next action; unless the list's own refresh (every 5 s) was it, and the login
        # form has already replaced the page.
        with contextlib.suppress(PlaywrightTimeout):
            page.click("text=Filter", timeout=3000)
        expect(page.locator("#login-message")).to_have_text(
            "Your key was refused (Invalid API key): log in again.")
        assert page.evaluate("sessionStorage.length") == 0


def test_a_node_that_stops_answering_shows_as_unreachable(console: Console, page: Page,
                                                          sbx: Sandbox) -> None:  # fmt: skip
    proc = console.node.proc
    assert proc is not None
    log_in(page, console.origin, API_KEY)
    page.wait_for_selector(row(page, sbx.sandbox_id))
    os.kill(proc.pid, signal.SIGSTOP)  # the node holds its sockets and answers nothing
    try:
        expect(page.locator("#notice")).to_contain_text("unreachable", timeout=40_000)
        expect(page.locator("#stamp")).to_contain_text("Unreachable")
        expect(page.locator(row(page, sbx.sandbox_id))).to_be_visible()  # as last seen
        screenshot(page, "unreachable")
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    expect(page.locator("#notice")).to_be_empty(timeout=30_000)  # back once it answers


def test_pause_and_resume_from_the_page_and_the_sdk_sees_them(console: Console, page: Page,
                                                              sbx: Sandbox) -> None:  # fmt: skip
    log_in(page, console.origin, API_KEY)
    page.fill("#f-metadata", "from=console-test")
    page.click("text=Filter")
    expect(page.locator(f"{row(page, sbx.sandbox_id)} td.state")).to_have_text("running")
    # Its live figures: the latest metrics sample's memory used, against its shape.
    expect(page.locator(f"{row(page, sbx.sandbox_id)} td.mem")).to_contain_text(
        " of 512 MiB", timeout=60_000)  # fmt: skip
    screenshot(page, "sandboxes-real")
    act(page, sbx.sandbox_id, "Pause")
    expect(page.locator("#notice")).to_have_text(f"Paused {sbx.sandbox_id}.",
                                                 timeout=120_000)  # fmt: skip
    assert sbx.get_info().state == SandboxState.PAUSED
    expect(page.locator(f"{row(page, sbx.sandbox_id)} td.state")).to_contain_text("paused")
    act(page, sbx.sandbox_id, "Resume")
    expect(page.locator("#notice")).to_have_text(f"Resumed {sbx.sandbox_id}.",
                                                 timeout=120_000)  # fmt: skip
    assert sbx.get_info().state == SandboxState.RUNNING
    assert sbx.commands.run("echo $((6*7))", timeout=120).stdout.strip() == "42"
    act(page, sbx.sandbox_id, "Kill")
    expect(page.locator(row(page, sbx.sandbox_id))).to_have_count(0, timeout=60_000)
    assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]


def test_another_team_sees_none_of_the_first_and_no_admin_page(console: Console, page: Page,
                                                               sbx: Sandbox) -> None:  # fmt: skip
    with team_key(console) as (key, _):
        log_in(page, console.origin, key)
        expect(page.locator("#sandboxes")).to_contain_text("No sandboxes.")
        expect(page.locator(row(page, sbx.sandbox_id))).to_have_count(0)
        page.click("#nav >> text=Teams and keys")
        expect(page.locator("#forbidden")).to_contain_text("403: this API key is not an "
                                                           "admin key")  # fmt: skip
        expect(page.locator("#admin table")).to_have_count(0)  # and nothing else
        screenshot(page, "admin-403")


def test_a_sandbox_page_cannot_reach_the_consoles_key(console: Console, page: Page,
                                                      sbx: Sandbox) -> None:  # fmt: skip
    """The data plane serves a sandbox's pages on the API's origin; the console's key lives on
    the console's origin, which a page the console opens cannot read back."""
    sbx.files.write("/home/user/www/index.html", "<title>the sandbox's page</title>")
    sbx.commands.run(f"cd /home/user/www && python3 -m http.server {SERVED_PORT}",
                     background=True)  # fmt: skip
    served = f"{console.node.origin}/proxy/{sbx.sandbox_id}/{SERVED_PORT}/"
    _wait_for(lambda: httpx.get(served).status_code == 200,
              "the sandbox's server never answered", 60)  # fmt: skip
    log_in(page, console.origin, API_KEY)
    with page.context.expect_page() as opened:
        page.evaluate("(url) => { window.open(url); }", served)
    sandbox_page = opened.value
    sandbox_page.wait_for_load_state()
    assert sandbox_page.title() == "the sandbox's page"
    # What a script of the sandbox's page could try, run as that page:
    got = sandbox_page.evaluate("""async (consoleOrigin) => {
        const tries = {};
        try { tries.opener = window.opener
                ? String(window.opener.sessionStorage.getItem("aenv.key")) : "none"; }
        catch (e) { tries.opener = "blocked: " + e.name; }
        tries.own = String(sessionStorage.getItem("aenv.key"));
        try { tries.fetch = await (await fetch(consoleOrigin + "/")).text(); }
        catch (e) { tries.fetch = "blocked: " + e.name; }
        return tries;
    }""", console.origin)
    assert API_KEY not in str(got), got
    assert got["opener"] == "none" and got["own"] == "null"
    assert got["fetch"].startswith("blocked"), got  # no CORS on the console's origin
    assert page.evaluate("sessionStorage.getItem('aenv.key')") == API_KEY  # still there


def test_the_terminal_runs_a_shell_and_ctrl_c_stops_a_command(console: Console, page: Page,
                                                              sbx: Sandbox) -> None:  # fmt: skip
    log_in(page, console.origin, API_KEY)
    page.click(f'a[href="#/sandbox/{sbx.sandbox_id}"]')
    expect(page.locator("#details")).to_contain_text("running")
    expect(page.locator("#log")).to_contain_text("sandbox.created", timeout=30_000)
    expect(page.locator("#chart-mem canvas")).to_have_count(1, timeout=30_000)
    page.click("#open-terminal")
    rows = page.locator("#terminal .xterm-rows")
    expect(rows).to_contain_text("$", timeout=60_000)  # bash's prompt
    page.keyboard.type("echo $((6*7))")
    page.keyboard.press("Enter")
    expect(rows).to_contain_text("42", timeout=30_000)
    page.keyboard.type("sleep 100")
    page.keyboard.press("Enter")
    _wait_for(lambda: sbx.commands.run("pgrep -x sleep || true").stdout.strip() != "",
              "sleep 100 never started")  # fmt: skip
    page.keyboard.press("Control+C")
    page.keyboard.type("echo after-$((2*2))")
    page.keyboard.press("Enter")
    expect(rows).to_contain_text("after-4", timeout=30_000)  # the shell is back
    assert sbx.commands.run("pgrep -x sleep || true").stdout.strip() == ""
    screenshot(page, "terminal")
    page.click("#nav >> text=Sandboxes")  # leaving the page ends its shell
    shell = "pgrep -f '^/bin/bash -i -l$' || true"  # not the SDK's `bash -l -c`
    _wait_for(lambda: sbx.commands.run(shell).stdout.strip() == "",
              "the terminal's shell outlived its page")  # fmt: skip


def test_files_upload_and_download_and_an_upload_over_the_disk(console: Console, page: Page,
                                                               sbx: Sandbox) -> None:  # fmt: skip
    sbx.files.write("/home/user/from-sdk.txt", "written by the SDK")
    log_in(page, console.origin, API_KEY)
    page.goto(f"{console.origin}/#/sandbox/{sbx.sandbox_id}")
    page.wait_for_selector('tr[data-file="from-sdk.txt"]', timeout=60_000)
    with page.expect_download() as got:
        page.click('button[aria-label="Download from-sdk.txt"]')
    assert Path(got.value.path()).read_text() == "written by the SDK"
    page.set_input_files("#upload", files=[{
        "name": "from-page.txt", "mimeType": "text/plain", "buffer": b"uploaded in the page"}])
    page.click("#file-browser >> text=Upload")
    expect(page.locator("#notice")).to_have_text("Uploaded /home/user/from-page.txt.")
    assert sbx.files.read("/home/user/from-page.txt") == "uploaded in the page"
    expect(page.locator('tr[data-file="from-page.txt"]')).to_be_visible()
    screenshot(page, "files")
    # Over the limit: the sandbox's disk all taken (root's reserve too: the agent writes
    # as root; the file system maps blocks, so its last MiBs are written, not allocated);
    # an upload gets the agent's 507.
    sbx.commands.run("fallocate -l $(( $(stat -f -c '%f * %S' /home/user) - (64 << 20) ))"
                     " /fill && (dd if=/dev/zero of=/fill2 bs=1M 2>/dev/null || true)",
                     user="root")  # fmt: skip
    page.set_input_files("#upload", files=[{
        "name": "big.bin", "mimeType": "application/octet-stream",
        "buffer": os.urandom(1 << 20)}])  # fmt: skip
    page.click("#file-browser >> text=Upload")
    expect(page.locator("#notice")).to_contain_text(
        "Uploading /home/user/big.bin was refused: 507: not enough disk space")
    assert sbx.commands.run("test -e /home/user/big.bin || echo gone").stdout == "gone\n"


def _tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _wait_for(cond: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def test_a_pasted_dockerfile_builds_with_its_log_shown(console: Console, page: Page) -> None:
    name = "console-" + os.urandom(3).hex()
    log_in(page, console.origin, API_KEY)
    page.click("#nav >> text=Templates")
    page.fill("#b-name", name)
    page.fill("#b-dockerfile", "FROM x\nCOPY app.py /app/\n")  # refused by name: no context
    page.click("#build-form >> text=Build")
    expect(page.locator("#notice")).to_contain_text(
        "The build was refused: the Dockerfile: COPY/ADD app.py /app/: it needs the build "
        "context's files")  # fmt: skip
    # A step of its own (a fresh marker): the log shows it run, not taken from the cache; its
    # COPY files from a context tar uploaded in the page.
    marker = os.urandom(4).hex()
    page.fill("#b-dockerfile", f"FROM e2bdev/base\nCOPY app/ /opt/app/\n"
                               f"RUN echo {marker} > /tmp/marker\nENV FROM_CONSOLE=1\n")
    page.set_input_files("#b-context", files=[{
        "name": "context.tar.gz", "mimeType": "application/gzip",
        "buffer": _tar_gz({"app/hello.txt": f"hello {marker}\n".encode()})}])
    with removed_after():  # the template and its step-cache entries
        page.click("#build-form >> text=Build")
        expect(page.locator("#build-status")).to_contain_text(": ready", timeout=240_000)
        expect(page.locator("#build-log")).to_contain_text(f"echo {marker}")
        expect(page.locator(f'tr[data-template="{name}"]')).to_contain_text("ready")
        expect(page.locator(f'tr[data-template="{name}"] td.tags')).to_have_text("default")
        screenshot(page, "templates")
        made = Sandbox.create(name, timeout=120)
        try:
            out = made.commands.run("cat /tmp/marker /opt/app/hello.txt; echo $FROM_CONSOLE")
            assert out.stdout == f"{marker}\nhello {marker}\n1\n"
        finally:
            made.kill()
        with console.admin() as api:
            assert api.delete(f"/templates/{name}").status_code == 204


def test_fork_snapshot_and_timeout_from_the_list_then_snapshots_and_volumes(
        console: Console, page: Page, sbx: Sandbox) -> None:  # fmt: skip
    made: list[str] = []
    snap, vol = "console-snap-" + os.urandom(3).hex(), "console-vol-" + os.urandom(3).hex()
    notice = page.locator("#notice")
    try:
        log_in(page, console.origin, API_KEY)
        page.wait_for_selector(row(page, sbx.sandbox_id))
        act(page, sbx.sandbox_id, "Timeout", "900")
        expect(notice).to_have_text(f"{sbx.sandbox_id} now ends in 900 s.")
        left = sbx.get_info().end_at.timestamp() - time.time()
        assert 850 < left <= 900, left
        act(page, sbx.sandbox_id, "Snapshot", snap)
        expect(notice).to_contain_text(f"of {sbx.sandbox_id}.", timeout=120_000)
        snapshot_id = notice.inner_text().split()[1]
        with console.admin() as api:
            assert [s["snapshotID"] for s in api.get("/snapshots", params={"name": snap}
                                                     ).json()] == [snapshot_id]  # fmt: skip
        act(page, sbx.sandbox_id, "Fork", "2")
        expect(notice).to_contain_text(f"Forked {sbx.sandbox_id} into ", timeout=120_000)
        children = notice.inner_text().removesuffix(".").split(" into ")[1].split(", ")
        made += children
        assert len(children) == 2
        for c in children:
            assert Sandbox.connect(c).commands.run("echo ok", timeout=120).stdout == "ok\n"
        # The lineage: the parent lists its forks, each links back to it.
        page.click(f'a[href="#/sandbox/{sbx.sandbox_id}"]')
        for c in children:
            expect(page.locator("#details dt:text-is('Forks') + dd")).to_contain_text(c)
        page.click(f'#details a[href="#/sandbox/{children[0]}"]')
        expect(page.locator("#details dt:text-is('Forked from') + dd")).to_have_text(
            sbx.sandbox_id)  # fmt: skip
        page.click("#nav >> text=Sandboxes")

        page.click("#nav >> text=Snapshots and volumes")
        taken = page.locator(f'tr[data-snapshot="{snapshot_id}"]')
        expect(taken).to_contain_text(sbx.sandbox_id)  # of which sandbox
        expect(taken.locator("td.size")).to_contain_text("iB")  # its files' bytes, not 0 B
        page.click(f'button[aria-label="New sandbox {snapshot_id}"]')
        page.click("#confirm-ok")
        expect(notice).to_contain_text(f"from {snapshot_id}.", timeout=120_000)
        made.append(notice.inner_text().split()[1])
        assert Sandbox.connect(made[-1]).commands.run("echo ok", timeout=120).stdout == "ok\n"
        page.click(f'button[aria-label="Delete {snapshot_id}"]')
        page.click("#confirm-ok")
        expect(page.locator(f'tr[data-snapshot="{snapshot_id}"]')).to_have_count(0)
        page.fill("#v-name", vol)
        page.click("text=New volume")
        expect(page.locator(f'tr[data-volume="{vol}"]')).to_be_visible()
        screenshot(page, "storage")
        page.click(f'button[aria-label="Delete {vol}"]')
        page.click("#confirm-ok")
        expect(page.locator(f'tr[data-volume="{vol}"]')).to_have_count(0)
        with console.admin() as api:
            assert api.get("/snapshots", params={"name": snap}).json() == []
            assert vol not in [v["name"] for v in api.get("/volumes").json()]
    finally:
        for sid in made:
            with contextlib.suppress(Exception):
                Sandbox.kill(sid)
