"""The memory admission formula (orchestrator/memory_admission.py)."""

from __future__ import annotations

from aenv.orchestrator.memory_admission import MIB, MemoryAdmission


def test_before_any_measurement_a_sandbox_is_estimated_at_a_quarter_of_its_ram() -> None:
    a = MemoryAdmission(budget_mib=1000, overcommit=10)
    assert a.refusal(running=0, nominal_mib=0, vms=1, new_mib=512) is None
    # 7 running, estimated 128 each: 7 * 128 + 128 = 1024 > 1000
    why = a.refusal(running=7, nominal_mib=7 * 512, vms=1, new_mib=512)
    assert why is not None and "over its budget of 1000 MiB" in why


def test_measured_use_admits_past_the_nominal_budget_up_to_the_overcommit() -> None:
    a = MemoryAdmission(budget_mib=1000, overcommit=20)
    a.record([50 * MIB] * 10)  # 10 sandboxes holding 50 MiB each: 500 MiB
    assert a.estimate_mib(512) == 50
    assert a.refusal(running=10, nominal_mib=5120, vms=9, new_mib=9 * 512) is None
    why = a.refusal(running=10, nominal_mib=5120, vms=11, new_mib=11 * 512)
    assert why is not None and "over its budget" in why  # 500 + 550 > 1000
    # The nominal bound: budget * overcommit.
    a = MemoryAdmission(budget_mib=1000, overcommit=4)
    why = a.refusal(running=0, nominal_mib=3800, vms=1, new_mib=512)
    assert why is not None and "overcommit 4" in why


def test_sandboxes_started_since_the_measurement_count_at_the_estimate() -> None:
    a = MemoryAdmission(budget_mib=1000, overcommit=10)
    a.record([100 * MIB] * 2)
    assert a.held_mib(running=5, nominal_mib=512) == 500
    assert a.refusal(running=9, nominal_mib=9 * 512, vms=1, new_mib=512) is None
    assert a.refusal(running=10, nominal_mib=10 * 512, vms=1, new_mib=512) is not None


def test_an_estimate_never_passes_the_nominal_ram() -> None:
    a = MemoryAdmission(budget_mib=1000, overcommit=4)
    a.record([900 * MIB])
    assert a.estimate_mib(256) == 256


def test_hot_vmms_count_as_held_and_a_fork_gets_the_children_that_fit() -> None:
    a = MemoryAdmission(budget_mib=1000, overcommit=10)
    a.record([100 * MIB] * 2, kept_bytes=300 * MIB)
    assert a.held_mib(running=2, nominal_mib=512) == 500
    # 500 held + n x 100 estimated <= 1000: five children of the eight asked for.
    assert a.room(running=2, nominal_mib=1024, per_mib=512, want=8) == 5
    # The nominal bound holds too: 1024 + n x 512 <= 10000 allows 17 of 20, the held part 5.
    assert a.room(running=2, nominal_mib=1024, per_mib=512, want=20) == 5
    a = MemoryAdmission(budget_mib=1000, overcommit=2)
    a.record([10 * MIB] * 2)
    assert a.room(running=2, nominal_mib=1024, per_mib=512, want=8) == 1  # 1024 + 512 <= 2000
