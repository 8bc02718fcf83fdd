"""The console's server: its pages, its scripts and `/config.json` (where the API is), each
with headers that keep the pages to their own scripts and out of other sites' frames.

It holds no key and calls nothing: the browser calls the API itself, across origins (the API
answers CORS for the console's origins, origins.py), with the key kept in the tab's memory.
"""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATIC = Path(__file__).parent / "static"
# The libraries `make setup` installs from the npm registry (web/package-lock.json), served as
# ES modules under /vendor/<name>/: no bundler, no CDN. Missing, the pages run without them.
LIBRARIES = Path(__file__).parent / "web" / "node_modules"
VENDOR = {"xterm": "@xterm/xterm", "addon-fit": "@xterm/addon-fit", "uplot": "uplot"}


def csp(api: str) -> str:
    """Scripts, styles and images from the console's origin only; calls to it and the API.
    Inline styles are allowed (not scripts): xterm.js themes its rows with a <style> it
    makes."""
    ws = "wss" + api[len("https"):] if api.startswith("https") else "ws" + api[len("http"):]
    return ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; "
            f"connect-src 'self' {api} {ws}; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'")


class _Headers:
    """Adds the console's security headers to every response."""

    def __init__(self, app: ASGIApp, api: str) -> None:
        self.app = app
        self.headers = [
            (b"content-security-policy", csp(api).encode()),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"),
            (b"x-frame-options", b"DENY"),
            (b"cross-origin-opener-policy", b"same-origin"),
            (b"cache-control", b"no-store"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.headers]
            await send(message)

        await self.app(scope, receive, with_headers)


def console_app(api: str) -> Starlette:
    """The console for the API at origin `api`."""

    async def index(_: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    async def config(_: Request) -> Response:
        return JSONResponse({"api": api})

    return Starlette(
        routes=[Route("/", index), Route("/config.json", config),
                Mount("/static", StaticFiles(directory=STATIC)),
                *(Mount(f"/vendor/{name}", StaticFiles(directory=LIBRARIES / package,
                                                       check_dir=False))
                  for name, package in VENDOR.items())],
        middleware=[Middleware(_Headers, api=api)],
    )  # fmt: skip
