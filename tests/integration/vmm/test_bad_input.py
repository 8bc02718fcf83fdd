"""Bad input to the runtime: each gives one clear error and leaves nothing behind."""

from __future__ import annotations

import json
import shutil

import pytest

from aenv.machines.api import AgentInit, TemplateNotFound
from aenv.orchestrator.builder import BuildError, kernel_path
from aenv.storage.templates import Template
from aenv.vmm.base import Accel, VmmError
from aenv.vmm.qemu import QemuDriver

pytestmark = pytest.mark.vm


def test_forced_kvm_that_does_not_work_is_an_error(runtime, tmp_path):
    drv = QemuDriver(accel="kvm", probe_kernel=runtime.driver.probe_kernel, cache_dir=tmp_path)
    if runtime.accel() == "kvm":
        pytest.skip("KVM works on this host")
    with pytest.raises(VmmError, match="accel=kvm was forced"):
        drv.check()


def test_auto_accel_falls_back_to_tcg_here(runtime):
    assert runtime.accel() in ("tcg", "kvm")
    assert QemuDriver(accel="tcg").accel().value == "tcg"


def test_the_kvm_boot_probe_command_boots_the_kernel(runtime):
    """The probe's exact command line (no capabilities, no_new_privs, QEMU's seccomp) under
    TCG: a command line broken for every accelerator would make a KVM host fall back to TCG
    without a word, so check it reaches the kernel's no-root-disk panic where TCG runs."""
    kernel = runtime.driver.probe_kernel
    assert kernel is not None and kernel.exists()
    drv = QemuDriver(accel="tcg")
    # TCG boots in ~1 s on an idle host; a CI host busy with other VMs takes longer.
    ok, out = drv.probe(Accel.TCG, kernel, deadline_s=120)
    assert ok, out
    assert drv.probe_boots(Accel.TCG, kernel.parent / "no-such-kernel", deadline_s=120) is False


def test_missing_kernel_is_a_clear_error(cfg, tmp_path):
    bad = cfg.model_copy(update={"kernel_path": tmp_path / "no-such-bzImage"})
    with pytest.raises(BuildError, match="does not exist"):
        kernel_path(bad, lambda m: None)


async def test_corrupt_template_snapshot_is_refused_and_leaves_nothing(runtime, sandbox_id):
    base = runtime.catalog.get("base")
    broken_snap = f"snap-broken-{sandbox_id}"
    shutil.copytree(runtime.snapshots.path(base.snapshot_id),
                    runtime.snapshots.path(broken_snap))
    (runtime.snapshots.path(broken_snap) / "manifest.json").write_text("{not json")
    runtime.catalog.put(Template(**{**base.to_json(), "name": "broken", "shape": base.shape,
                                    "snapshot_id": broken_snap}))
    machines = set(runtime.machines())
    try:
        with pytest.raises(TemplateNotFound, match="not usable"):
            await runtime.create(sandbox_id, "broken", AgentInit())
        # a missing state file is refused as well
        (runtime.snapshots.path(broken_snap) / "manifest.json").write_text(
            json.dumps(runtime.snapshots.get(base.snapshot_id).to_json()))
        (runtime.snapshots.path(broken_snap) / "state").unlink()
        with pytest.raises(TemplateNotFound, match="missing state"):
            await runtime.create(sandbox_id, "broken", AgentInit())
    finally:
        shutil.rmtree(runtime.snapshots.path(broken_snap))
        shutil.rmtree(runtime.catalog.dir("broken"))
    assert sandbox_id not in runtime.machines()
    assert not (runtime.cfg.sandboxes_dir / sandbox_id).exists()
    assert set(runtime.machines()) == machines
