"""Guest kernel builder: config checks, cache key, and the build pipeline on a fake source tree.

No real kernel is built here; the fake tree's Makefile stands in for kbuild.
"""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import pytest

from aenv.storage import kernel
from aenv.storage.kernel import (
    FRAGMENT_PATH,
    KernelBuildError,
    ensure_kernel,
    fragment_hash,
    kernel_cache_key,
    parse_config,
    verify_config,
)

FRAGMENT = """\
# why: comments are allowed
CONFIG_A=y
CONFIG_B=m
CONFIG_S="text"
# CONFIG_OFF is not set
"""

CONFIG = """\
#
# Automatically generated file; DO NOT EDIT.
#
CONFIG_A=y
CONFIG_B=m
CONFIG_S="text"
CONFIG_EXTRA=y
# CONFIG_OFF is not set
"""


def test_real_fragment_parses() -> None:
    options = parse_config(FRAGMENT_PATH.read_text(), strict=True)
    assert options["CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES"] == "y"
    assert options["CONFIG_UNIX98_PTYS"] == "y"
    assert options["CONFIG_INOTIFY_USER"] == "y"
    assert options["CONFIG_MODULES"] is None
    assert all(name.startswith("CONFIG_") for name in options)


def test_verify_config_accepts_matching_config() -> None:
    assert verify_config(FRAGMENT, CONFIG) == []
    # An unset option may also be absent altogether.
    assert verify_config(FRAGMENT, CONFIG.replace("# CONFIG_OFF is not set\n", "")) == []


def test_verify_config_reports_dropped_option() -> None:
    problems = verify_config(FRAGMENT, CONFIG.replace("CONFIG_A=y\n", ""))
    assert problems == ["CONFIG_A=y (final .config: unset)"]


def test_verify_config_reports_mismatches() -> None:
    config = CONFIG.replace("CONFIG_B=m", "CONFIG_B=y").replace(
        "# CONFIG_OFF is not set", "CONFIG_OFF=y"
    )
    problems = verify_config(FRAGMENT, config)
    assert problems == [
        "CONFIG_B=m (final .config: y)",
        "CONFIG_OFF unset (final .config: y)",
    ]


def test_fragment_with_garbage_line_is_rejected() -> None:
    with pytest.raises(KernelBuildError, match="line 2"):
        verify_config("CONFIG_A=y\nCONIFG_B y\n", CONFIG)


def test_cache_key_is_stable_and_follows_fragment_and_version() -> None:
    key = kernel_cache_key(FRAGMENT, "6.12.117-1~deb12u1")
    assert key == kernel_cache_key(FRAGMENT, "6.12.117-1~deb12u1")
    assert key == f"6.12.117-1~deb12u1-{fragment_hash(FRAGMENT)}"
    assert len(fragment_hash(FRAGMENT)) == 16
    assert kernel_cache_key(FRAGMENT + "CONFIG_C=y\n", "6.12.117-1~deb12u1") != key
    assert kernel_cache_key(FRAGMENT, "6.12.118-1") != key
    # An epoch's colon does not end up in a directory name.
    assert kernel_cache_key(FRAGMENT, "1:6.12/x").startswith("1_6.12_x-")


# --- the pipeline, on a fake source tree -------------------------------------------------------

MAKEFILE = """\
tinyconfig:
\techo '# tiny' > .config
kvm_guest.config:
\techo kvm >> /dev/null
aenv.config:
\t{aenv_recipe}
bzImage:
\tmkdir -p arch/x86/boot && echo image > arch/x86/boot/bzImage && echo elf > vmlinux
"""


def _fake_source(tmp_path: Path, aenv_recipe: str) -> Path:
    """A linux-source-like .tar.xz whose Makefile fakes the kbuild targets we call."""
    tarball = tmp_path / "linux-source-fake.tar.xz"
    files = {
        "linux-source-fake/Makefile": MAKEFILE.format(aenv_recipe=aenv_recipe),
        "linux-source-fake/arch/x86/configs/.keep": "",
    }
    with tarfile.open(tarball, "w:xz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return tarball


@pytest.fixture
def fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    monkeypatch.setattr(kernel, "source_version", lambda: "6.12.0-fake")
    monkeypatch.setattr(kernel, "TOOLS", ("make", "tar"))
    return tmp_path


def test_build_installs_bzimage_vmlinux_and_config(
    fake_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = "cp arch/x86/configs/aenv.config .config"
    monkeypatch.setattr(kernel, "SOURCE_TARBALL", _fake_source(fake_env, recipe))
    lines: list[str] = []
    image = ensure_kernel(fake_env / "artifacts", log=lines.append, jobs=1)
    assert image == fake_env / "artifacts/kernel" / kernel_cache_key() / "bzImage"
    assert image.read_text() == "image\n"
    assert (image.parent / "vmlinux").is_file()
    assert (image.parent / ".config").read_text() == FRAGMENT_PATH.read_text()
    assert not list((fake_env / "artifacts/kernel").glob("tmp-*"))
    assert any("compiling" in line for line in lines)
    # Cached: no second build, no log lines.
    lines.clear()
    assert ensure_kernel(fake_env / "artifacts", log=lines.append) == image
    assert lines == []


def test_dropped_option_fails_and_leaves_nothing(
    fake_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = "grep -v '^CONFIG_PVH=' arch/x86/configs/aenv.config > .config"
    monkeypatch.setattr(kernel, "SOURCE_TARBALL", _fake_source(fake_env, recipe))
    with pytest.raises(KernelBuildError, match=r"CONFIG_PVH=y \(final .config: unset\)"):
        ensure_kernel(fake_env / "artifacts", log=lambda _: None)
    assert [p.name for p in (fake_env / "artifacts/kernel").iterdir()] == [".lock"]


def test_failed_make_reports_log_tail_and_leaves_nothing(
    fake_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = "echo 'boom: no such thing' && false"
    monkeypatch.setattr(kernel, "SOURCE_TARBALL", _fake_source(fake_env, recipe))
    with pytest.raises(KernelBuildError, match="'aenv.config'") as err:
        ensure_kernel(fake_env / "artifacts", log=lambda _: None)
    assert "boom: no such thing" in str(err.value)
    assert [p.name for p in (fake_env / "artifacts/kernel").iterdir()] == [".lock"]


def test_missing_source_package_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kernel, "SOURCE_PACKAGE", "linux-source-does-not-exist")
    if shutil.which("dpkg-query") is None:
        pytest.skip("not a Debian host")
    with pytest.raises(KernelBuildError, match="linux-source-does-not-exist is not installed"):
        ensure_kernel(tmp_path, log=lambda _: None)
    assert not (tmp_path / "kernel").exists()
