"""For the whole suite: on CI (AENV_STRICT_SKIPS=1), a skip whose reason is not on the list in
tests/support/skips.py is a failure (tests/support/strict_skips.py; docs/testing.md, "Skips")."""

pytest_plugins = ["tests.support.strict_skips"]
