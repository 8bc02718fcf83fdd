"""A Dockerfile's text and its context made into an E2B build by the SDK's own parser, its
COPY files stored as the SDK's uploads would be (images/dockerfile.py, api/dockerfile_builds.py)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import httpx
import pytest

from aenv.api.apierror import ApiError
from aenv.api.dockerfile_builds import prepare
from aenv.images.context import ContextStore
from aenv.images.steps import BuildSpec


def _tar(files: dict[str, bytes], evil: str | None = None, link: str | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in {**files, **({evil: b"x"} if evil else {})}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo("app.py")
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
    return buf.getvalue()


def test_the_sdks_steps_of_a_dockerfile() -> None:
    spec = prepare("FROM e2bdev/base\nRUN echo hi > /tmp/x\nENV A=1\nWORKDIR /srv\n", None, None)
    assert spec["fromImage"] == "e2bdev/base"
    steps = [(s["type"], s["args"]) for s in spec["steps"]]
    assert ("RUN", ["echo hi > /tmp/x"]) in steps and ("ENV", ["A", "1"]) in steps
    assert ("WORKDIR", ["/srv"]) in steps
    BuildSpec.model_validate(spec).check()  # what the build API takes


def test_copy_files_are_stored_under_the_sdks_hash(tmp_path: Path) -> None:
    contexts = ContextStore(tmp_path / "contexts", 1 << 20)
    text = "FROM e2bdev/base\nCOPY app/ /opt/app/\nRUN cat /opt/app/main.py\n"
    context = _tar({"app/main.py": b"print('hi')\n", "other.txt": b"not copied"})
    spec = prepare(text, context, contexts)
    [copy] = [s for s in spec["steps"] if s["type"] == "COPY"]
    assert contexts.present(copy["filesHash"])
    with tarfile.open(contexts.path(copy["filesHash"])) as tar:
        assert tar.getnames() == ["app", "app/main.py"]  # the step's, as the SDK packs them
        assert tar.extractfile("app/main.py").read() == b"print('hi')\n"  # type: ignore[union-attr]
    # The same files again: the same hash, nothing stored twice.
    assert prepare(text, context, contexts) == spec


@pytest.mark.parametrize(("text", "context", "says"), [
    ("RUN echo\n", None, "must contain a FROM instruction"),
    ("FROM x\nCOPY app.py /app/\n", None, "COPY/ADD app.py /app/: it needs the build context"),
    ("FROM x\nADD a.tar /a\n", None, "COPY/ADD a.tar /a"),
    ("/etc/passwd", None, "unknown instruction: /etc/passwd"),  # a text, never read as a path
    ("FROM x\nCOPY missing.py /app/\n", _tar({"app.py": b""}), "missing.py"),
    ("FROM x\nRUN true\n", _tar({}, evil="../escape"), "leaves the build context"),
    ("FROM x\nRUN true\n", b"not a tar", "the build context"),
    ("FROM x\nRUN true\n", _tar({}, link="/etc/passwd"), "only files and directories"),
])  # fmt: skip
def test_what_cannot_be_built_is_a_400(text: str, context: bytes | None, says: str,
                                       tmp_path: Path) -> None:  # fmt: skip
    with pytest.raises(ApiError) as e:
        prepare(text, context, ContextStore(tmp_path, 1 << 20))
    assert e.value.status == 400 and says in str(e.value), str(e.value)


async def test_the_route_refuses_bad_input_in_one_line(client: httpx.AsyncClient) -> None:
    async def post(**body: object) -> httpx.Response:
        return await client.post("/v3/templates/dockerfile",
                                 json={"name": "t", "dockerfile": "FROM x\n", **body})  # fmt: skip

    r = await post(context="not base64!")
    assert r.status_code == 400 and r.json() == {"code": 400, "message": "context: not base64"}
    for bad in ({"dockerfile": ""}, {"extra": 1}, {"cpuCount": 0}, {"dockerfile": 5}):
        r = await post(**bad)
        assert r.status_code == 400 and r.json()["code"] == 400, bad
    # A node with no VMs builds nothing: it says so (the real runtime's are e2e cases).
    r = await post()
    assert r.status_code == 400 and "builds no templates" in r.json()["message"]


async def test_the_overview_window_is_bounded(client: httpx.AsyncClient) -> None:
    for window in (0, 59, 3601, "x"):
        r = await client.get("/overview", params={"window": window})
        assert r.status_code == 400 and "window" in r.json()["message"], window
    r = await client.get("/overview", params={"window": 60})
    assert r.status_code == 200 and r.json()["team"]["teamID"] == "default"
    assert r.json()["node"] is not None  # the node's own key is an admin's
