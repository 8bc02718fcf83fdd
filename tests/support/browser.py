"""A real headless Chromium (Debian's `chromium`) driven by Playwright, for the console's
tests: Playwright's own browser download is not available here, so it launches the system's
binary. The flags keep it off the network (no background requests, updates or sync).
Screenshots go to $AENV_ARTIFACTS (default tests/artifacts), which is not committed."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, Request, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("AENV_ARTIFACTS") or Path(__file__).parents[1] / "artifacts")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-dev-shm-usage"]  # fmt: skip
SIZE = {"width": 1280, "height": 800}


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no {CHROMIUM}: scripts/install-host-deps.sh installs Debian's chromium",
                    pytrace=False)  # fmt: skip
    with sync_playwright() as pw:
        # As root Chromium needs --no-sandbox; Playwright gives it a new empty profile.
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(name="browser", scope="module")
def browser_fixture() -> Iterator[Browser]:
    """A Chromium for a test module (import this and page_fixture to use them)."""
    with chromium() as b:
        yield b


@pytest.fixture(name="page")
def page_fixture(browser: Browser) -> Iterator[Page]:
    """A page in a context of its own (no storage shared with other tests)."""
    context = browser.new_context(viewport=SIZE)  # type: ignore[arg-type]
    page = context.new_page()
    # What the page met, printed at teardown (pytest shows it when the test failed): a
    # script that did not load or threw leaves a page that waits for nothing.
    seen: list[str] = []
    start = time.monotonic()

    def note(what: str) -> None:
        seen.append(f"{time.monotonic() - start:7.2f}s {what}")

    page.on("console", lambda m: note(f"console.{m.type}: {m.text}"))
    page.on("pageerror", lambda e: note(f"error: {e}"))
    page.on("crash", lambda _: note("the page crashed"))
    page.on("load", lambda _: note(f"loaded {page.url}"))
    page.on("requestfailed", lambda r: note(f"failed: {r.method} {r.url} {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and note(f"{r.status}: {r.url}"))
    try:
        yield page
    finally:
        print("the page met:", *seen or ["nothing of note"], sep="\n  ")
        context.close()


def screenshot(page: Page, name: str) -> Path:
    """The page at 1280x800 in the artifacts folder, for a reviewer to look at."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"console-{name}.png"
    page.set_viewport_size(SIZE)
    page.screenshot(path=str(path))
    return path


def scrolls_sideways(page: Page, width: int = 800) -> bool:
    """Whether the page, `width` px wide, is wider than its window."""
    page.set_viewport_size({"width": width, "height": 800})
    return bool(page.evaluate(
        "document.documentElement.scrollWidth > document.documentElement.clientWidth"))


def open_console(page: Page, url: str, attempts: int = 3) -> None:
    """`page.goto(url)` until the console's script has drawn its page. Chromium aborts the
    loads in flight whenever any interface of the host changes (net::ERR_NETWORK_CHANGED),
    and a node adds and removes interfaces for its sandboxes and pools: a load it aborted is
    made again, nothing else is."""
    changed: list[str] = []

    def note(r: Request) -> None:
        if "ERR_NETWORK_CHANGED" in (r.failure or ""):
            changed.append(r.url)

    for attempt in range(attempts):
        changed.clear()
        page.on("requestfailed", note)
        try:
            page.goto(url)
            page.wait_for_selector("#main > *", timeout=15_000)
            return
        except PlaywrightTimeout:
            if not changed or attempt == attempts - 1:
                raise
            print(f"the host's network changed under {', '.join(changed)}: loading {url} again")
        finally:
            page.remove_listener("requestfailed", note)


def log_in(page: Page, console: str, key: str) -> None:
    """Opens the console at its login and logs in with `key` (which must be taken)."""
    open_console(page, console + "/")
    page.fill("#key", key)
    page.press("#key", "Enter")
    page.wait_for_selector("#nav:not([hidden])")


def row(page: Page, sandbox_id: str) -> str:
    """The selector of a sandbox's row on the sandboxes page."""
    return f'tr[data-sandbox="{sandbox_id}"]'


def act(page: Page, sandbox_id: str, action: str, value: str | None = None) -> None:
    """Clicks a sandbox's action (Pause, Resume, Fork, ...) and confirms it, with `value` in
    the dialog's field (a fork's count, a snapshot's name, a timeout)."""
    page.click(f'{row(page, sandbox_id)} button[aria-label="{action} {sandbox_id}"]')
    if value is not None:
        page.fill("#confirm-input", value)
    page.click("#confirm-ok")
