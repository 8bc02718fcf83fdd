"""The adoption record: what a later node process needs to re-adopt a running sandbox's VM.

A node killed with -9 leaves its QEMUs running (each launcher has its own session), with
their network slots, jails and directories. `<vm dir>/vm.json` names what the new process
cannot find out by itself: the slot, the processes (pid + start time), the machine the VM
was started as, the template and the agent's token. It is written (write, fsync, rename)
once the guest took its /init, i.e. once the VM is a sandbox a client may hold, and removed
when the VMM ends (pause, kill): a VM without one is never adopted.

The directory belongs to the jail uid, which can replace files in it, so a reader accepts
only a regular, root-owned file (the jail cannot make one), and the runtime still checks
every process it names against the jail's cgroup and uid (`jail.adopt`).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from aenv.config import MachineShape
from aenv.storage.files import write_json_atomic
from aenv.vmm.jail import JailIdentity

FILE = "vm.json"
MAX_BYTES = 64 * 1024


class NotAdoptable(Exception):
    """This VM is not adopted (the reason is for the log); reclaim ends what is left of it."""


class AdoptionRecord(BaseModel, frozen=True):
    kind: Literal["aenv.vm"] = "aenv.vm"
    format_version: Literal[1] = 1
    sandbox_id: str
    template_id: str  # the template the VM's snapshots name (Machine.template_id)
    slot_index: int
    slot_addr: str  # where the agent answers; must match the sandbox's record
    shape: MachineShape
    kernel: str
    tools: str
    cmdline: str
    jail: JailIdentity
    access_token: str | None = None


def write(workdir: Path, rec: AdoptionRecord) -> None:
    """Atomically and never through a planted symlink (see write_json_atomic); 0600: it
    holds the token."""
    write_json_atomic(workdir / FILE, rec.model_dump(mode="json"), mode=0o600)


def remove(workdir: Path) -> None:
    (workdir / FILE).unlink(missing_ok=True)


def read(workdir: Path) -> AdoptionRecord:
    """The record in `workdir` (which may be a symlink to a pooled VM's directory)."""
    try:
        fd = os.open(workdir / FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotAdoptable("no adoption record (its VMM never took /init or has ended)"
                           ) from None
    except OSError as e:
        raise NotAdoptable(f"adoption record unreadable: {e}") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0:
            raise NotAdoptable("adoption record is not a root-owned regular file")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise NotAdoptable("adoption record is too large")
    try:
        return AdoptionRecord.model_validate(json.loads(data))
    except (ValueError, ValidationError) as e:
        raise NotAdoptable(f"adoption record invalid: {e}") from e
