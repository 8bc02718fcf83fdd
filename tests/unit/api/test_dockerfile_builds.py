"""A Dockerfile's text made into an E2B build by the SDK's own parser (api/dockerfile_builds.py)."""

from __future__ import annotations

import pytest

from aenv.api.apierror import ApiError
from aenv.api.dockerfile_builds import parse
from aenv.images.steps import BuildSpec


def test_the_sdks_steps_of_a_dockerfile() -> None:
    spec = parse("FROM e2bdev/base\nRUN echo hi > /tmp/x\nENV A=1\nWORKDIR /srv\n")
    assert spec["fromImage"] == "e2bdev/base"
    steps = [(s["type"], s["args"]) for s in spec["steps"]]
    assert ("RUN", ["echo hi > /tmp/x"]) in steps and ("ENV", ["A", "1"]) in steps
    assert ("WORKDIR", ["/srv"]) in steps
    BuildSpec.model_validate(spec).check()  # what the build API takes


@pytest.mark.parametrize(("text", "says"), [
    ("RUN echo\n", "must contain a FROM instruction"),
    ("FROM x\nCOPY app.py /app/\n", "COPY/ADD app.py /app/: a Dockerfile given as text has no "
                                    "build context"),
    ("FROM x\nADD a.tar /a\n", "COPY/ADD a.tar /a"),
    ("/etc/passwd", "unknown instruction: /etc/passwd"),  # a text, never read as a path
])  # fmt: skip
def test_what_cannot_be_built_is_a_400_that_says_why(text: str, says: str) -> None:
    with pytest.raises(ApiError) as e:
        parse(text)
    assert e.value.status == 400 and says in str(e.value)
