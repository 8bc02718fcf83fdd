"""`python -m aenv.interpreter [--port 49999] [--languages python,javascript]`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import uvicorn

from aenv.interpreter.app import ENVS_URL, Settings, make_app
from aenv.interpreter.languages import DEFAULT_CWD


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="aenv-interpreter")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=49999)
    p.add_argument("--languages", default="python",
                   help="default contexts made before it reports healthy, comma-separated")
    p.add_argument("--envs-url", default=ENVS_URL)
    p.add_argument("--cwd", default=DEFAULT_CWD, help="contexts' directory by default")
    p.add_argument("--ipython-dir", type=Path, default=None,
                   help="the kernels' IPython profile directory (default ~/.ipython)")
    p.add_argument("--state-dir", type=Path, default=None,
                   help="where it writes its kernel specs (default "
                   "~/.local/share/aenv-interpreter)")
    p.add_argument("--preload", default="",
                   help="python code run silently in the default python context before it "
                   "reports healthy (imports a snapshot then keeps)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    languages = tuple(x.strip() for x in args.languages.split(",") if x.strip())
    app = make_app(Settings(languages=languages, envs_url=args.envs_url, cwd=args.cwd,
                            ipython_dir=args.ipython_dir, state_dir=args.state_dir,
                            preload=args.preload))
    # Keep-alive past any client pool's idle timeout; no access log (each run is a line).
    uvicorn.run(app, host=args.host, port=args.port, timeout_keep_alive=640, access_log=False)


if __name__ == "__main__":
    main()
