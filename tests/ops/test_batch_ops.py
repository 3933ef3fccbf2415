"""Diagnose and the timeline on logs of a batched instance: a rank that stalls holds every task
of its batch, and each gets a finding naming it; a task's timeline keeps its ranks' heartbeats
when they are about the whole batch."""

from __future__ import annotations

from events.catalogue import TaskFailed
from services.ops.offline import diagnose_scan
from services.ops.scan import scan
from services.ops.timeline import build_timeline
from tests.ops import batch_scenarios


def test_a_rank_stalled_in_a_batch_is_named_in_a_finding_for_every_task_of_the_batch() -> None:
    log = batch_scenarios.batch_rank_stalls_in_compute()
    findings = diagnose_scan(scan(enumerate(log.records, 1))).findings
    by_task = {f.task_id or "": f for f in findings if f.kind == "task"}
    assert sorted(by_task) == ["t1", "t2"]
    for task_id, finding in by_task.items():
        assert (finding.cause, finding.stuck_ranks, finding.status) == ("stalled_in_compute", (1,), "failed")
        mate = "t2" if task_id == "t1" else "t1"
        assert f"in a batch with {mate} on i1" in finding.evidence
        assert finding.ranks[1].stack is not None  # the stuck rank's stack, though the beat names t1 first
    [failed] = [r.event for r in log.records if isinstance(r.event, TaskFailed) and r.event.task_id == "t2"]
    assert "task t1 stalled in a batch of 2 (t1, t2)" in failed.error  # the watchdog saw the batch


def test_a_batch_that_completed_has_no_findings() -> None:
    log = batch_scenarios.batch_completed()
    assert not diagnose_scan(scan(enumerate(log.records, 1))).findings


def test_each_tasks_timeline_keeps_the_heartbeats_of_its_batch() -> None:
    log = batch_scenarios.batch_rank_stalls_in_compute()
    for task_id in batch_scenarios.BATCH:
        timeline = build_timeline(task_id, [(r.seq, r.event) for r in log.records])
        stuck = [lane for lane in timeline.lanes if lane.first_stack is not None]
        assert [lane.rank for lane in stuck] == [0, 1]
        assert timeline.decode is not None and timeline.decode.tokens == 10
