"""A pytest plugin for the suite runners (`-p aenv_deselect`, this folder on PYTHONPATH):
deselects the tests whose node ids are listed, exactly, in $AENV_DESELECT (one per line).
pytest's own --deselect takes a prefix: `test_cwd_java` would take `test_cwd_javascript`."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = set(filter(None, os.environ.get("AENV_DESELECT", "").splitlines()))
    if not wanted:
        return
    gone = [i for i in items if i.nodeid in wanted]
    items[:] = [i for i in items if i.nodeid not in wanted]
    config.hook.pytest_deselected(items=gone)
