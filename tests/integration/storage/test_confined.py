"""Package code of aenv's own templates runs confined (storage/confined.py): chrooted into the
tree, with no network, no host process in sight, no service started, nothing left running;
and a stopped build step ends at once (storage/children.py)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from aenv.storage import children, confined

BUSYBOX = Path("/bin/busybox")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "tmp").mkdir()
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    for name in ("sh", "ls", "cat", "ip", "ps", "sleep", "echo", "test", "wc"):
        (root / "bin" / name).symlink_to("busybox")
    return root


def test_a_step_sees_only_its_tree_loopback_and_its_own_processes(tree: Path,
                                                                   tmp_path: Path) -> None:
    log = tmp_path / "log"
    script = ("ls / > /tmp/root; cat /proc/net/dev > /tmp/net; ps -o pid,comm > /tmp/ps; "
              "test -x /usr/sbin/policy-rc.d && /usr/sbin/policy-rc.d; echo $? > /tmp/policy; "
              "sleep 300 &")  # fmt: skip
    with confined.no_services(tree):
        confined.run(tree, ["/bin/sh", "-c", script], log)
    assert not (tree / confined.POLICY_RC_D).exists()  # removed after
    assert (tree / "tmp/policy").read_text().strip() == "101"  # no service may start
    assert set((tree / "tmp/root").read_text().split()) == {"bin", "tmp", "proc", "usr"}
    ifaces = [ln.split(":")[0].strip() for ln in (tree / "tmp/net").read_text().splitlines()[2:]]
    assert ifaces == ["lo"]
    procs = (tree / "tmp/ps").read_text().splitlines()[1:]
    assert procs and all(int(p.split()[0]) < 10 for p in procs), procs  # its own pid space
    # What it left running ended with it, and its /proc is not mounted on the host.
    assert "sleep 300" not in subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                             text=True).stdout  # fmt: skip
    assert str(tree / "proc") not in Path("/proc/mounts").read_text()


def test_a_failing_step_names_its_command_and_output(tree: Path, tmp_path: Path) -> None:
    with pytest.raises(confined.ConfinedError, match=r"(?s)/bin/sh in .* failed \(exit 3\).*boom"):
        confined.run(tree, ["/bin/sh", "-c", "echo boom; exit 3"], tmp_path / "log")


def test_stopping_ends_a_running_step_and_refuses_the_next(tree: Path, tmp_path: Path) -> None:
    group = children.Children()
    errors: list[BaseException] = []

    def step() -> None:
        with children.stoppable(group):
            try:
                confined.run(tree, ["/bin/sh", "-c", "sleep 300"], tmp_path / "log")
            except BaseException as e:  # the test reads it
                errors.append(e)

    t = threading.Thread(target=step)
    t0 = time.monotonic()
    t.start()
    time.sleep(0.5)
    group.stop()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 10
    assert len(errors) == 1 and isinstance(errors[0], children.Stopped), errors
    with children.stoppable(group), pytest.raises(children.Stopped):
        children.run(["true"], subprocess.DEVNULL)
    assert "sleep 300" not in subprocess.run(["ps", "-eo", "args"], capture_output=True,
                                             text=True).stdout  # fmt: skip
