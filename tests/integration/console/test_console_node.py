"""The console of a node on the fake runtime, in a real headless Chromium: its own origin and
CORS for it alone, where the key is kept, the keyboard, the layout at 800 px, the overview
and the admin page. tests/e2e/test_console.py drives it against real VMs and the SDK."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.support import browser as b
from tests.support.browser import browser_fixture, page_fixture  # noqa: F401 (fixtures)
from tests.support.cluster import Child, aenv
from tests.support.host import free_port

KEY = "console-test-key"


@dataclass
class Node:
    child: Child
    console: str

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.child.origin, headers={"X-API-Key": KEY}, timeout=30)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    d = tmp_path_factory.mktemp("console")
    port, console = free_port(), free_port()
    child = Child(aenv("server"), port, d / "node.log", {
        "AENV_RUNTIME": "fake", "AENV_DATA_DIR": str(d), "AENV_API_KEY": KEY,
        "AENV_INSTANCE": "cn" + os.urandom(2).hex(), "AENV_HOST": "127.0.0.1",
        "AENV_PORT": str(port), "AENV_CONSOLE_PORT": str(console), "AENV_LOG_LEVEL": "info",
        "AENV_OVERVIEW_SAMPLE_S": "1",
    })  # fmt: skip
    child.start()
    try:
        assert f"Web console: http://127.0.0.1:{console}" in child.tail(), child.tail()
        yield Node(child, f"http://127.0.0.1:{console}")
    finally:
        assert child.stop() == 0, child.tail()


def _create(node: Node, n: int) -> list[str]:
    with node.api() as c:
        return [c.post("/sandboxes", json={"templateID": "base", "timeout": 600}).json()
                ["sandboxID"] for _ in range(n)]  # fmt: skip


def _kill_all(node: Node) -> None:
    with node.api() as c:
        for s in c.get("/v2/sandboxes").json():
            c.delete(f"/sandboxes/{s['sandboxID']}")


def test_the_api_answers_cors_for_the_console_alone(node: Node) -> None:
    def preflight(origin: str) -> httpx.Response:
        return httpx.options(node.child.origin + "/v2/sandboxes", headers={
            "Origin": origin, "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "x-api-key"})  # fmt: skip

    ok = preflight(node.console)
    assert ok.headers["access-control-allow-origin"] == node.console
    assert "x-api-key" in ok.headers["access-control-allow-headers"].lower()
    assert "access-control-allow-credentials" not in ok.headers  # no cookie ever counts
    for other in ("http://evil.test", node.child.origin, "http://127.0.0.1:1"):
        assert "access-control-allow-origin" not in preflight(other).headers, other
    with node.api() as c:
        listed = c.get("/v2/sandboxes", headers={"Origin": node.console})
    assert listed.headers["access-control-allow-origin"] == node.console
    assert "x-next-token" in listed.headers["access-control-expose-headers"].lower()


def test_the_data_plane_answers_cors_for_the_console_to_agents_alone(node: Node) -> None:
    def preflight(origin: str, port: int) -> httpx.Response:
        return httpx.options(
            f"{node.child.origin}/proxy/someid/{port}/process.Process/Start",
            headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "x-access-token,content-type"})  # fmt: skip

    ok = preflight(node.console, 49983)
    assert ok.status_code == 204
    assert ok.headers["access-control-allow-origin"] == node.console
    assert "x-access-token" in ok.headers["access-control-allow-headers"]
    for origin, port in (("http://evil.test", 49983), (node.console, 8080)):
        assert "access-control-allow-origin" not in preflight(origin, port).headers
    # A refused request (no such sandbox) still tells the console why.
    r = httpx.post(f"{node.child.origin}/proxy/someid/49983/files",
                   headers={"Origin": node.console})  # fmt: skip
    assert r.status_code == 502 and r.headers["access-control-allow-origin"] == node.console


def test_the_key_stays_in_the_tab(node: Node, page: Page) -> None:
    b.log_in(page, node.console, KEY)
    assert KEY not in page.url
    assert page.context.cookies() == []
    assert page.evaluate("localStorage.length") == 0
    assert page.evaluate("sessionStorage.getItem('aenv.key')") == KEY
    # Another tab of the console has no key: it shows the login.
    other = page.context.new_page()
    other.goto(node.console + "/#/sandboxes")
    expect(other.locator("#key")).to_be_visible()
    page.click("#logout")
    expect(page.locator("#key")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0


def test_every_action_is_reachable_by_keyboard_and_nothing_scrolls_sideways(
        node: Node, page: Page) -> None:  # fmt: skip
    ids = _create(node, 2)
    try:
        page.goto(node.console + "/")
        assert not b.scrolls_sideways(page)
        b.screenshot(page, "login")
        page.keyboard.type(KEY)  # the key field has the focus
        page.keyboard.press("Enter")
        page.wait_for_selector(b.row(page, ids[0]))
        label = f"Pause {ids[0]}"
        for _ in range(60):  # Tab until the first sandbox's Pause button
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.getAttribute('aria-label')") == label:
                break
        else:
            pytest.fail(f"Tab never reached {label!r}")
        page.keyboard.press("Enter")
        expect(page.locator("#confirm-ok")).to_be_focused()
        page.keyboard.press("Enter")
        expect(page.locator(f"{b.row(page, ids[0])} td.state")).to_have_text("paused (cold)")
        with node.api() as c:
            assert c.get(f"/sandboxes/{ids[0]}").json()["state"] == "paused"
        assert not b.scrolls_sideways(page)
        b.screenshot(page, "sandboxes")
        page.goto(node.console + "/#/admin")
        page.wait_for_selector("#admin table")
        assert not b.scrolls_sideways(page)
        b.screenshot(page, "admin")
        page.goto(node.console + "/#/nodes")  # a single node: its gateway lists a cluster's
        expect(page.locator("#no-cluster")).to_contain_text("console of its gateway")
    finally:
        _kill_all(node)


def test_a_refused_action_shows_the_apis_message(node: Node, page: Page) -> None:
    [sid] = _create(node, 1)
    b.log_in(page, node.console, KEY)
    page.wait_for_selector(b.row(page, sid))
    with node.api() as c:
        c.delete(f"/sandboxes/{sid}")  # gone behind the page's back
    b.act(page, sid, "Pause")
    expect(page.locator("#notice")).to_contain_text(f"Pause {sid} was refused: ")
    expect(page.locator("#notice")).to_contain_text("doesn't exist")


def test_static_files_are_the_consoles_own(node: Node) -> None:
    root = Path(__file__).parents[3] / "src/aenv/console/static"
    for path in ("/static/js/main.js", "/static/console.css"):
        r = httpx.get(node.console + path)
        assert r.status_code == 200 and r.content == (root / path[len("/static/"):]).read_bytes()


def test_the_overview_shows_the_teams_hour_and_the_node_to_admins(node: Node, page: Page) -> None:
    ids = _create(node, 3)
    try:
        with node.api() as c:
            assert c.post(f"/sandboxes/{ids[0]}/pause").status_code == 204
            team = c.post("/admin/teams", json={"name": "overview", "maxSandboxes": 5}).json()
            key = c.post("/admin/keys", json={"team": team["teamID"]}).json()["key"]
            created = c.post("/sandboxes", json={"templateID": "base"},
                             headers={"X-API-Key": key}).json()["sandboxID"]  # fmt: skip
        time.sleep(2.5)  # two samples of the node's ring buffer (1 s apart here)
        with node.api() as c:
            mine = c.get("/overview").json()
            theirs = c.get("/overview", headers={"X-API-Key": key}).json()
        assert mine["team"]["now"] == {"running": 2, "paused": 1, "hot": 0, "cold": 1,
                                       "memoryMB": 2 * 512}  # fmt: skip
        assert mine["team"]["history"][-1]["running"] == 2
        assert mine["node"]["now"]["running"] == 3 and mine["node"]["maxSandboxes"] > 0
        assert any(p["createsPerMin"] > 0 for p in mine["node"]["history"])
        assert theirs["team"]["now"]["running"] == 1 and theirs["team"]["maxSandboxes"] == 5
        assert theirs["node"] is None  # not an admin's key: nothing of the node or others

        b.log_in(page, node.console, KEY)
        page.goto(node.console + "/#/overview")
        expect(page.locator("#c-running")).to_contain_text("2")
        expect(page.locator("#c-paused")).to_contain_text("0 hot, 1 cold")
        expect(page.locator("#c-node")).to_contain_text("3 of ")
        expect(page.locator("#chart-team canvas")).to_have_count(1)
        expect(page.locator("#chart-held canvas")).to_have_count(1)
        assert not b.scrolls_sideways(page)
        b.screenshot(page, "overview")
        page.click("#logout")
        b.log_in(page, node.console, key)
        page.goto(node.console + "/#/overview")
        expect(page.locator("#c-running")).to_contain_text("1 of 5")
        expect(page.locator("#chart-team canvas")).to_have_count(1)
        expect(page.locator("#c-node")).to_have_count(0)
        expect(page.locator("#chart-held")).to_have_count(0)
        with node.api() as c:
            c.delete(f"/sandboxes/{created}", headers={"X-API-Key": key})
            c.delete(f"/admin/teams/{team['teamID']}")
    finally:
        _kill_all(node)


def test_teams_limits_and_keys_from_the_admin_page(node: Node, page: Page) -> None:
    name = "console-" + os.urandom(2).hex()
    b.log_in(page, node.console, KEY)
    page.goto(node.console + "/#/admin")
    page.fill("#t-name", name)
    page.fill("#t-max", "3")
    page.click("button:text-is(\"New team\")")
    team = page.locator(f'tr[data-team="{name}"]')
    expect(team).to_contain_text("0 of 3")
    team.locator("button", has_text="Sandbox limit").click()
    page.fill("#confirm-input", "5")
    page.click("#confirm-ok")
    expect(team).to_contain_text("0 of 5")
    page.select_option("#k-team", label=name)
    page.fill("#k-name", "from-the-page")
    page.click("button:text-is(\"New key\")")
    secret = page.locator("#new-key-secret").inner_text()
    with node.api() as c:  # the key shown once works, for that team
        r = c.get("/v2/sandboxes", headers={"X-API-Key": secret})
        assert r.status_code == 200 and r.json() == []
        key = next(k for k in c.get("/admin/keys").json() if k["name"] == "from-the-page")
    page.click(f'button[aria-label="Revoke {key["mask"]}"]')
    page.click("#confirm-ok")
    expect(page.locator("#notice")).to_have_text(f"Revoked {key['mask']}.")
    with node.api() as c:
        assert c.get("/v2/sandboxes", headers={"X-API-Key": secret}).status_code == 401
        assert c.delete(f"/admin/teams/{name}").status_code == 204
