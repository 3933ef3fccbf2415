from __future__ import annotations

import pytest

from services.ops.findings import CAUSES, Cause, Diagnosis
from services.ops.offline import diagnose_scan
from services.ops.scan import scan
from services.ops.synthetic import LogBuilder
from tests.ops import scenarios
from tests.ops.scenarios import Scenario


def diagnosis_of(scenario: Scenario) -> Diagnosis:
    log = scenario()
    return diagnose_scan(scan(enumerate(log.records, 1)))


def instance_that_never_loads() -> LogBuilder:
    """An instance whose only runner is still loading after 700 s (no task involved)."""
    log = LogBuilder()
    log.node_joined("n1")
    log.instance_placed("i1", ["n1"])
    log.runner_status("i1", 0, "loading")
    log.advance(700)
    log.node_joined("n2")
    return log


CASES: list[tuple[Scenario, str, Cause, tuple[int, ...]]] = [
    (scenarios.runner_failed, "task", "rank_died", (1,)),
    (scenarios.heartbeat_silence, "task", "rank_died", (1,)),
    (scenarios.watchdog_failed_after_silence, "task", "rank_died", (1,)),
    (scenarios.compute_stall, "task", "stalled_in_compute", (1,)),
    (scenarios.collective_stall, "task", "stalled_in_collective", (0, 1)),
    (scenarios.iteration_mismatch, "task", "iteration_mismatch", (1,)),
    (scenarios.cancel_split, "task", "cancel_ignored", (1,)),
    (scenarios.cancel_no_telemetry, "task", "cancel_ignored", (0, 1)),
    (scenarios.node_timed_out, "task", "node_timed_out", (1,)),
    (scenarios.no_instance, "task", "never_assigned", ()),
    (scenarios.instance_loading, "task", "never_assigned", ()),
    (scenarios.failed_with_error, "task", "rank_error", (0,)),
    (scenarios.quiet_no_telemetry, "task", "no_evidence", (0, 1)),
    (scenarios.idle_instance_rank_failed, "instance", "rank_died", (1,)),
    (scenarios.node_gone_idle, "node", "node_timed_out", (1,)),
    (scenarios.killed_then_peer_failed, "task", "rank_died", (1,)),
    (scenarios.peer_failed_before_kill_reported, "task", "rank_died", (1,)),
    (scenarios.sleeping_rank_short_deadline, "task", "stalled_in_compute", (1,)),
    (scenarios.frozen_rank_short_deadline, "task", "rank_died", (1,)),
    (scenarios.unplaceable_model, "task", "never_assigned", ()),
    (scenarios.rank_error_then_shutdown, "task", "rank_error", (0,)),
    (instance_that_never_loads, "instance", "instance_not_ready", (0,)),
]


@pytest.mark.parametrize(("scenario", "kind", "cause", "stuck"), CASES)
def test_each_hang_shape_gets_its_cause(scenario: Scenario, kind: str, cause: Cause, stuck: tuple[int, ...]) -> None:
    findings = diagnosis_of(scenario).findings
    assert [(f.kind, f.cause, f.stuck_ranks) for f in findings] == [(kind, cause, stuck)]
    finding = findings[0]
    assert finding.next_step and finding.summary and finding.evidence


def test_every_cause_is_covered_by_a_scenario() -> None:
    assert {cause for _scenario, _kind, cause, _stuck in CASES} == set(CAUSES)


def test_healthy_log_has_no_findings() -> None:
    assert diagnosis_of(scenarios.healthy).findings == ()


def test_stall_finding_carries_stack_phase_and_iteration() -> None:
    finding = diagnosis_of(scenarios.compute_stall).findings[0]
    rank1 = finding.ranks[1]
    assert rank1.phase == "prefill"
    assert rank1.iteration == 3
    assert rank1.stack is not None and "llama.py" in rank1.stack
    assert rank1.heartbeat_ago_s == 0.0
    assert rank1.phase_age_s == 40.0
    assert "llama.py" in finding.next_step  # the operator sees where it sits without opening the stack


def test_unassigned_reasons_name_the_missing_model_and_the_loading_rank() -> None:
    assert "no instance of model 'big'" in diagnosis_of(scenarios.no_instance).findings[0].summary
    finding = diagnosis_of(scenarios.instance_loading).findings[0]
    assert "rank 1: loading" in finding.summary


def test_offline_reference_is_the_end_of_the_log() -> None:
    log = scenarios.heartbeat_silence()
    diagnosis = diagnose_scan(scan(enumerate(log.records, 1)))
    assert diagnosis.reference == "end_of_log"
    assert diagnosis.reference_wall_ns == log.now_ns
    later = diagnose_scan(scan(enumerate(log.records, 1)), now_ns=log.now_ns + 3600 * 10**9)
    assert later.reference == "wall_clock"
    assert later.findings[0].idle_s > 3600


def test_young_quiet_task_is_not_a_finding_yet() -> None:
    log = scenarios.started(stop_after=3)
    log.advance(5)
    log.node_joined("n3")
    assert diagnose_scan(scan(enumerate(log.records, 1))).findings == ()


def test_frozen_rank_is_told_apart_from_an_exited_one() -> None:
    frozen = diagnosis_of(scenarios.frozen_rank_short_deadline).findings[0]
    assert "no exit" in frozen.next_step and "ps -o" in frozen.next_step
    killed = diagnosis_of(scenarios.killed_then_peer_failed).findings[0]
    assert "Read the runner output" in killed.next_step
    assert any("consequence" in line for line in killed.evidence)


def test_never_assigned_names_the_masters_error() -> None:
    finding = diagnosis_of(scenarios.unplaceable_model).findings[0]
    assert "cannot be loaded" in finding.summary and finding.next_step
