"""The fault injector both runner shells use (SHOAL_TEST_FAULT); its kill and freeze run for real in
tests/runner/test_group_failures.py, its sleep in tests/e2e/test_hang_catalogue.py."""

from __future__ import annotations

import pytest

from runner.engine.protocols import NeverCancelled
from runner.flight.faults import FAULT_ENV, Die, Fault, FaultAction, FaultInjector, Freeze, Sleep, parse_fault
from runner.local.testing.tools import FixedCancel


def test_parse_reads_every_action() -> None:
    assert parse_fault("sleep:1:3:40") == Fault(rank=1, poll=3, action=Sleep(40.0))
    assert parse_fault("freeze:2:4") == Fault(rank=2, poll=4, action=Freeze())
    assert parse_fault("die:0:0") == Fault(rank=0, poll=0, action=Die())
    assert parse_fault(None) is None and parse_fault("") is None


@pytest.mark.parametrize("value", ["sleep:1:3", "die:1:2:5", "explode:1:2", "freeze"])
def test_parse_names_the_expected_forms(value: str) -> None:
    with pytest.raises(ValueError, match=f"{FAULT_ENV}=.*expected sleep:<rank>:<poll>:<seconds>"):
        parse_fault(value)


def injector(fault: str, rank: int) -> tuple[FaultInjector, list[FaultAction]]:
    acted: list[FaultAction] = []
    return FaultInjector(parse_fault(fault), rank, act=acted.append), acted


def test_acts_once_at_the_chosen_poll_of_the_first_task() -> None:
    faults, acted = injector("freeze:1:2", rank=1)
    start, task = faults.around(FixedCancel(False)), faults.around(NeverCancelled())
    assert not start.is_cancelled("t1")  # poll 0: the start agreement
    assert not task.is_cancelled("t1") and acted == []  # poll 1
    assert not task.is_cancelled("t1") and acted == [Freeze()]  # poll 2
    for _ in range(3):
        task.is_cancelled("t1")
        task.is_cancelled("t2")
    assert acted == [Freeze()]


def test_polls_of_a_later_task_do_not_count() -> None:
    faults, acted = injector("die:0:1", rank=0)
    cancel = faults.around(NeverCancelled())
    cancel.is_cancelled("first")
    cancel.is_cancelled("second")
    cancel.is_cancelled("second")
    assert acted == []
    cancel.is_cancelled("first")
    assert acted == [Die()]


def test_the_inner_answer_passes_through() -> None:
    faults, acted = injector("sleep:0:0:0", rank=0)
    assert faults.around(FixedCancel(True)).is_cancelled("t") and acted == [Sleep(0.0)]


def test_other_ranks_get_their_cancel_source_unchanged() -> None:
    inner = NeverCancelled()
    assert FaultInjector(parse_fault("die:1:0"), rank=0).around(inner) is inner
    assert FaultInjector(None, rank=0).around(inner) is inner


def test_from_env_reads_the_variable() -> None:
    inner = NeverCancelled()
    assert FaultInjector.from_env(1, {FAULT_ENV: "die:1:0"}).around(inner) is not inner
    assert FaultInjector.from_env(1, {}).around(inner) is inner


def test_a_load_fault_acts_once_while_loading_and_never_in_a_task() -> None:
    assert parse_fault("freeze:1:load") == Fault(rank=1, poll=None, action=Freeze())
    faults, acted = injector("sleep:1:load:5", rank=1)
    cancel = faults.around(NeverCancelled())
    faults.loading()
    faults.loading()
    for _ in range(5):
        cancel.is_cancelled("t1")
    assert acted == [Sleep(5.0)]
    other_rank, untouched = injector("die:0:load", rank=1)
    other_rank.loading()
    assert untouched == []
