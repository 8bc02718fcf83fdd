"""Admission: whether the node takes an operation, decided before it touches anything.

In order: the node is not shutting down (503), the team's limits, `max_sandboxes`, the
node's memory (`memory_admission.py`) and `max_concurrent_boots` (429; a team's limit says
Should-Retry false, a full node gives Retry-After), and free space on the data filesystem
(507, `space.py`). Callers insert or CAS their record with no await after admission, so
the counts stay exact. In a cluster the
team's limits are also checked across nodes, in the placement transaction
(`cluster/placement.py`).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import pydantic

from aenv.config import MachineShape
from aenv.obs import REJECTED_TOTAL
from aenv.orchestrator import space
from aenv.orchestrator.boots import BootSlots
from aenv.orchestrator.errors import (
    CapacityExhausted,
    InvalidRequest,
    SpaceExhausted,
    TeamLimitReached,
)
from aenv.orchestrator.memory_admission import MemoryAdmission
from aenv.orchestrator.requests import BOOTS_RETRY_AFTER_S, FULL_RETRY_AFTER_S, CreateRequest
from aenv.orchestrator.states import HOLDS_CAPACITY
from aenv.teams.model import TeamNotFound


class TeamHolding(Protocol):
    """Places of a limited team held across a cluster while an operation no placement made
    runs (`cluster/team_holds.py`)."""

    def hold(self, team_id: str, vms: int, memory_mib: int, op: str
             ) -> AbstractAsyncContextManager[None]: ...  # fmt: skip


class Admission:
    """Part of `Orchestrator` (orchestrator/service.py), whose state it uses."""

    memory: MemoryAdmission
    boots: BootSlots

    team_holds: TeamHolding | None = None  # set by a node of a cluster

    def team_hold(self, team_id: str, vms: int, memory_mib: int, op: str
                  ) -> AbstractAsyncContextManager[None]:  # fmt: skip
        """In a cluster, the team's places held for a fork's children or a woken sandbox
        (TeamLimitReached past its limits across the cluster); alone, nothing to hold."""
        if self.team_holds is None:
            return contextlib.nullcontext()
        return self.team_holds.hold(team_id, vms, memory_mib, op)

    def _check_timeout(self, timeout_s: int) -> None:
        if timeout_s < 0:
            raise InvalidRequest("timeout must not be negative")
        if timeout_s > self.config.max_timeout_s:
            raise InvalidRequest(
                f"timeout cannot be greater than {self.config.max_timeout_s} seconds"
            )

    def _shape(self, base: MachineShape, req: CreateRequest) -> MachineShape:
        if req.vcpus is None and req.memory_mib is None:
            return base
        try:
            return MachineShape(
                vcpus=req.vcpus if req.vcpus is not None else base.vcpus,
                memory_mib=req.memory_mib if req.memory_mib is not None else base.memory_mib,
                disk_mib=base.disk_mib,
            )
        except pydantic.ValidationError as e:
            err = e.errors()[0]
            name = {"vcpus": "cpuCount", "memory_mib": "memoryMB"}.get(str(err["loc"][0]), "")
            raise InvalidRequest(f"invalid {name}: {err['msg']}") from None

    def _admit(self, new_mib: int, op: str, *, vms: int = 1, boot: bool = True,
               new: bool = True, team_id: str | None = None) -> None:
        """Refuse an operation before it touches anything: shutting down (503), over the
        team's limits or max_sandboxes or max_concurrent_boots (429), short of space (507).
        Callers insert or CAS their record with no await after this, so the counts stay
        exact."""
        self._refuse(new=new)
        if team_id is not None:
            self.admit_team(team_id, vms, new_mib, op)
        if vms and self.store.count(HOLDS_CAPACITY) + vms > self.config.max_sandboxes:
            REJECTED_TOTAL.labels("max_sandboxes").inc()
            raise CapacityExhausted(
                f"the node is at its limit of {self.config.max_sandboxes} running sandboxes",
                retry_after_s=FULL_RETRY_AFTER_S,
            )
        if vms and (why := self.memory.refusal(
                running=self.store.count(HOLDS_CAPACITY), vms=vms, new_mib=new_mib,
                nominal_mib=self.store.sum_memory_mib(HOLDS_CAPACITY))):
            REJECTED_TOTAL.labels("memory").inc()
            raise CapacityExhausted(f"cannot {op}: {why}", retry_after_s=FULL_RETRY_AFTER_S)
        if boot and self.boots.full:  # after waiting up to admission_queue_s (boots.py)
            REJECTED_TOTAL.labels("max_concurrent_boots").inc()
            raise CapacityExhausted(
                f"the node is already booting {self.config.max_concurrent_boots} sandboxes "
                f"(and {self.boots.waiting} more wait for them)",
                retry_after_s=BOOTS_RETRY_AFTER_S,
            )
        self._admit_space(new_mib, op)

    def admit_team(self, team_id: str, vms: int, new_mib: int, op: str) -> None:
        """TeamLimitReached if `vms` more sandboxes of `new_mib` MiB in all would take the
        team past its limits (running and restoring sandboxes count, as for the node's)."""
        if self.teams is None:
            return
        try:
            team = self.teams.team(team_id)
        except TeamNotFound:  # gone (another node deleted it): nothing left to hold it to
            return
        if team.max_sandboxes is not None:
            have = self.store.count(HOLDS_CAPACITY, team_id)
            if have + vms > team.max_sandboxes:
                REJECTED_TOTAL.labels("team_sandboxes").inc()
                raise TeamLimitReached(
                    f"cannot {op}: team {team.name!r} may run {team.max_sandboxes} sandboxes "
                    f"at once and runs {have}; kill or pause some, or ask for a higher limit")
        if team.max_memory_mib is not None:
            have = self.store.sum_memory_mib(HOLDS_CAPACITY, team_id)
            if have + new_mib > team.max_memory_mib:
                REJECTED_TOTAL.labels("team_memory").inc()
                raise TeamLimitReached(
                    f"cannot {op}: team {team.name!r} may use {team.max_memory_mib} MiB of "
                    f"sandbox memory and uses {have}; {new_mib} MiB more would pass it")

    def _admit_space(self, new_mib: int, op: str, *, keep_running: bool = True) -> None:
        """507 unless free space >= RAM of the running sandboxes (`keep_running`) + `new_mib`
        + the reserve (space.py)."""
        running = self.store.sum_memory_mib(HOLDS_CAPACITY) if keep_running else 0
        reserve = self.config.disk_reserve_mib
        free = self.free_bytes()
        short = space.shortfall(free, running, new_mib, reserve)
        if short:
            REJECTED_TOTAL.labels("disk_space").inc()
            raise SpaceExhausted(
                f"not enough free space on the data filesystem to {op}: {free >> 20} MiB free, "
                f"{(free + short) >> 20} MiB needed ({space.explain(running, new_mib, reserve)})"
            )
