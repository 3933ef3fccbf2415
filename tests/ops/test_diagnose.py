from __future__ import annotations

import pytest

from services.ops.findings import CAUSES, Diagnosis
from services.ops.offline import diagnose_scan
from services.ops.scan import scan
from tests.ops import scenarios
from tests.ops.scenarios import Scenario


def diagnosis_of(scenario: Scenario) -> Diagnosis:
    log = scenario()
    return diagnose_scan(scan(enumerate(log.records, 1)))


@pytest.mark.parametrize("case", scenarios.CATALOGUE, ids=lambda case: case.scenario.__name__)
def test_each_hang_shape_gets_its_cause(case: scenarios.Case) -> None:
    findings = diagnosis_of(case.scenario).findings
    assert [(f.kind, f.cause, f.stuck_ranks) for f in findings] == [(case.kind, case.cause, case.stuck)]
    finding = findings[0]
    assert finding.next_step and finding.summary and finding.evidence


def test_every_cause_is_covered_by_a_scenario() -> None:
    covered = {case.cause for case in scenarios.CATALOGUE}
    assert set(CAUSES) - covered == {"instance_not_ready", "load_timed_out", "quarantined_event"}  # below; security


def test_instance_that_never_loads() -> None:
    log = scenarios.LogBuilder()
    log.node_joined("n1")
    log.instance_placed("i1", ["n1"])
    log.runner_status("i1", 0, "loading")
    log.advance(700)
    log.node_joined("n2")
    findings = diagnose_scan(scan(enumerate(log.records, 1))).findings
    assert [(f.kind, f.cause, f.stuck_ranks) for f in findings] == [("instance", "instance_not_ready", (0,))]


def test_instance_retired_by_the_loading_deadline_names_the_ranks_still_loading() -> None:
    findings = diagnosis_of(scenarios.frozen_while_loading).findings
    assert [(f.kind, f.cause) for f in findings] == [("task", "never_assigned"), ("instance", "load_timed_out")]
    task, instance = findings
    assert "not ready within 60s" in task.summary
    assert instance.stuck_ranks == (0, 1) and "still loading" in instance.summary
    assert instance.ranks[1].heartbeat_ago_s is not None and instance.ranks[1].heartbeat_ago_s > 50  # frozen
    assert instance.ranks[0].heartbeat_ago_s is not None and instance.ranks[0].heartbeat_ago_s < 2  # waiting on it
    assert "instance_ready_timeout_seconds" in instance.next_step


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


def test_a_rank_to_blame_is_pointed_at_its_stderr_file_where_its_node_keeps_one() -> None:
    log = scenarios.started(stop_after=3)
    log.node_joined("n2", host="10.0.0.2", runner_logs="/data/shoal/runner-logs/n2")  # a re-announce, newer workers
    log.runner_status("i1", 1, "failed", scenarios.KILLED, cause="killed")
    scenarios.master_decides(log)
    finding = diagnose_scan(scan(enumerate(log.records, 1))).findings[0]
    assert finding.stuck_ranks == (1,)
    assert "rank 1's stderr: /data/shoal/runner-logs/n2/i1.rank1.log on host 10.0.0.2 (node n2)" in finding.evidence


def test_a_node_that_announced_no_stderr_directory_gets_no_file_named() -> None:
    finding = diagnosis_of(scenarios.killed_then_peer_failed).findings[0]
    assert not any("stderr:" in line for line in finding.evidence)
