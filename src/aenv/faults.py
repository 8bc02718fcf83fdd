"""Named fault points: steps inside multi-step operations where a crash test makes the node
die abruptly, as a kill -9 at exactly that step would.

    fault("pause.after_save")

does nothing (one truth test) unless armed. The node arms points from `Config.faults`
(`AENV_FAULTS`, e.g. `pause.after_save=exit`) when it starts; an armed point writes one
line to stderr and ends the process at once: `exit` is `os._exit(137)` (no cleanup, no
flush, no atexit: what the host sees after SIGKILL), `kill` sends itself SIGKILL. Every
point is listed in POINTS (docs/architecture.md repeats the list), so a test can iterate
them; tests/unit/test_faults.py checks each `fault()` call names a listed point.
"""

from __future__ import annotations

import os
import signal

# name -> what is true on the host when the node dies there
POINTS: dict[str, str] = {
    "create.before_restore":
        "record Creating; slot, VM directory and RAM/disk clones in place, QEMU waiting "
        "for its device state",
    "create.before_init": "record Creating; the guest runs but has not had its /init",
    "create.after_record": "record Running, the VM answers; the create call gets no reply",
    "save.after_stop": "pause/snapshot/fork: vCPUs stopped, device state not saved yet",
    "pause.after_save": "record Pausing; device state saved and fsynced, no manifest",
    "pause.after_manifest": "record Pausing; paused state complete on disk, VMM still alive",
    "pause.before_record": "record Pausing; paused state complete, VMM ended",
    "resume.before_restore": "record Resuming; paused state intact, QEMU waiting for it",
    "resume.before_init":
        "record Resuming; the guest runs again (paused state forgotten), no /init yet",
    "fork.after_snapshot": "source Forking, children Creating; fork snapshot taken, no child",
    "fork.after_child": "source Forking; one child restored and initialised, others pending",
    "snapshot.before_rename": "record Snapshotting; files cloned into the staging directory",
    "snapshot.after_put": "record Snapshotting; snapshot complete, the VM still stopped",
    "kill.before_record": "record Killing; VM ended and its files deleted",
}
ACTIONS = ("exit", "kill")
EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL

_armed: dict[str, str] = {}


class FaultSpecError(ValueError):
    """AENV_FAULTS names an unknown point or action."""


def parse(spec: str) -> dict[str, str]:
    """`point[=action],...` -> {point: action}; the action defaults to exit."""
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, action = item.partition("=")
        action = action or "exit"
        if name not in POINTS:
            raise FaultSpecError(f"unknown fault point {name!r} (known: {', '.join(POINTS)})")
        if action not in ACTIONS:
            raise FaultSpecError(f"unknown fault action {action!r} (known: {', '.join(ACTIONS)})")
        out[name] = action
    return out


def arm(spec: str) -> None:
    """Arm exactly the points in spec (an empty spec disarms all)."""
    _armed.clear()
    _armed.update(parse(spec))


def armed() -> dict[str, str]:
    return dict(_armed)


def fault(name: str) -> None:
    """End the process here if `name` is armed."""
    if not _armed:
        return
    action = _armed.get(name)
    if action is None:
        return
    os.write(2, f"aenv: fault point {name} reached: {action}\n".encode())
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(EXIT_CODE)
