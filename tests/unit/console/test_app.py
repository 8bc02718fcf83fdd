"""The console's server (console/app.py) and its origins (origins.py), in process."""

from __future__ import annotations

import httpx
import pytest

from aenv.config import Config
from aenv.console.app import console_app
from aenv.origins import api_origin, console_origins, console_port

API = "http://127.0.0.1:8000"


async def _get(path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=console_app(API))
    async with httpx.AsyncClient(transport=transport, base_url="http://console") as c:
        return await c.get(path)


async def test_every_answer_keeps_the_page_to_its_own_scripts() -> None:
    for path in ("/", "/static/js/main.js", "/static/console.css", "/config.json", "/nothing"):
        r = await _get(path)
        csp = r.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self';" in csp, path
        assert f"connect-src 'self' {API} ws://127.0.0.1:8000;" in csp
        assert "frame-ancestors 'none'" in csp and "script-src 'self';" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"
        assert r.headers["cache-control"] == "no-store"
    page = await _get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/static/js/main.js">' in page.text
    assert "<script>" not in page.text  # no inline script: the CSP would refuse it
    assert (await _get("/config.json")).json() == {"api": API}
    assert (await _get("/static/js/main.js")).headers["content-type"].startswith(
        "text/javascript")  # served as a module script
    assert (await _get("/static/../app.py")).status_code == 404
    # The libraries `make setup` installs (web/package-lock.json), as module scripts.
    for lib in ("/vendor/xterm/lib/xterm.mjs", "/vendor/addon-fit/lib/addon-fit.mjs",
                "/vendor/uplot/dist/uPlot.esm.js"):
        r = await _get(lib)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert (await _get("/vendor/xterm/css/xterm.css")).status_code == 200


@pytest.mark.parametrize(("settings", "origins"), [
    ({}, ["http://127.0.0.1:8002", "http://localhost:8002"]),
    ({"host": "0.0.0.0", "port": 9000}, ["http://127.0.0.1:9002", "http://localhost:9002"]),
    ({"host": "10.1.2.3", "console_port": 7000}, ["http://10.1.2.3:7000"]),
    ({"console_origin": "https://console.example.com/"}, ["https://console.example.com"]),
    ({"console": False}, []),
])  # fmt: skip
def test_the_console_origins(settings: dict[str, object], origins: list[str]) -> None:
    cfg = Config(**settings)  # type: ignore[arg-type]
    assert console_origins(cfg) == origins
    assert console_port(cfg) == (cfg.console_port or cfg.port + 2)


def test_the_api_origin() -> None:
    assert api_origin(Config(host="0.0.0.0", port=8000)) == "http://127.0.0.1:8000"
    assert api_origin(Config(host="::1", port=8000)) == "http://[::1]:8000"
    assert api_origin(Config(public_url="https://api.example.com/")) == "https://api.example.com"
