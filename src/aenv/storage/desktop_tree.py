"""The `desktop` template's root filesystem, for E2B's desktop SDK (`e2b-desktop`): the
minimal Debian with an X server (Xvfb), the xfce4 desktop, the tools the SDK drives
(xdotool, scrot, x11vnc, xdpyinfo), Debian's noVNC at `/opt/noVNC` (where the SDK starts
`utils/novnc_proxy`) and a browser, all from Debian's archive (`storage.rootfs`).

Its start command starts the desktop as the SDK would (display :0, 1024x768, 96 dpi), and the
template is snapshotted once xfce4's session, window manager and desktop run: a sandbox's
`Sandbox.create()` finds them running (its own Xvfb start is then a no-op that fails on the
taken display) instead of waiting for xfce4 to start under TCG.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from aenv.storage import rootfs

PACKAGES = ("xvfb", "x11-utils", "xauth", "dbus-x11", "xfce4", "xfce4-terminal", "xdotool",
            "scrot", "x11vnc", "novnc", "websockify", "firefox-esr", "fonts-dejavu-core",
            "xdg-utils")  # fmt: skip
START = "/usr/local/bin/aenv-desktop"
READY = "pgrep -x xfce4-session >/dev/null && pgrep -x xfwm4 >/dev/null && pgrep -x xfdesktop >/dev/null"  # noqa: E501 (the SDK's own check)
DESKTOP = """#!/bin/sh
# The desktop as E2B's desktop SDK starts it: Xvfb on :0 (its default size and dpi), xfce4.
export DISPLAY=:0
Xvfb :0 -ac -screen 0 1024x768x24 -retro -dpi 96 -nolisten tcp -nolisten unix &
for i in $(seq 300); do xdpyinfo -display :0 >/dev/null 2>&1 && break; sleep 0.2; done
exec startxfce4
"""


def version() -> str:
    return hashlib.sha256(repr((PACKAGES, DESKTOP)).encode()).hexdigest()[:12]


def make(root: Path, log_file: Path, log: Callable[[str], None]) -> None:
    rootfs.debian(root, log_file, log, PACKAGES)
    (root / "opt").mkdir(exist_ok=True)
    (root / "opt/noVNC").symlink_to("/usr/share/novnc")
    start = root / START.lstrip("/")
    start.write_text(DESKTOP)
    start.chmod(0o755)
