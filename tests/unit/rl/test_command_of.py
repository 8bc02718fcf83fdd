"""What a model's text asks of the sandbox (aenv.rl.client.command_of, the adapters' convention)."""

from __future__ import annotations

import pytest

from aenv.rl.client import command_of


@pytest.mark.parametrize(("action", "want"), [
    ("let me look\n<bash>ls -la</bash>", "ls -la"),
    ("<bash>cd /x</bash> then <bash> make test </bash>", "make test"),  # the last one
    ("```bash\npytest -x\n```", "pytest -x"),
    ("```sh\necho hi\n```", "echo hi"),
    ("<bash>\n</bash>", None),  # an empty command ends the episode
    ("no command here", None),
    ("<bash>ls</bash> <submit/>", None),  # submitting wins
    ("<submit>", None),
])  # fmt: skip
def test_command_of(action: str, want: str | None) -> None:
    assert command_of(action) == want
