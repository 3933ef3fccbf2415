from __future__ import annotations

import pytest

from events.catalogue import AnyEvent
from events.ids import TaskId
from services.ops.offline import timeline_and_findings
from services.ops.scan import scan
from services.ops.synthetic import LogBuilder, PrefillPlan, simulate_decode, simulate_prefill
from services.ops.timeline import build_timeline
from tests.ops import scenarios


def pairs(log: LogBuilder) -> list[tuple[int, AnyEvent]]:
    return [(r.seq, r.event) for r in log.records]


def pipelined(world: int = 3, chunks: int = 4) -> LogBuilder:
    log = LogBuilder()
    log.ready_instance("i1", [f"n{r}" for r in range(world)])
    log.advance(1)
    log.task_created("t1")
    log.advance(0.01)
    log.task_assigned("t1", "i1")
    simulate_prefill(log, PrefillPlan(task_id="t1", instance_id="i1", world=world, chunks=chunks, iteration_s=0.1))
    simulate_decode(log, "t1", 10, token_s=0.02, per_chunk=2)
    log.cancelled("t1")
    log.completed("t1", "cancelled", tokens=10)
    return log


def test_each_rank_gets_a_bar_per_chunk_and_its_bubbles_as_gaps() -> None:
    timeline = build_timeline("t1", pairs(pipelined(world=3, chunks=4)))
    assert [lane.rank for lane in timeline.lanes] == [0, 1, 2]
    for lane in timeline.lanes:
        assert [bar.iteration for bar in lane.bars] == [k + lane.rank for k in range(4)]
        assert [bar.processed for bar in lane.bars] == [256, 512, 768, 1024]
        assert lane.path == "pipeline" and lane.chunks == 4 and lane.done_ms is not None
        for bar in lane.bars:
            assert bar.end_ms - bar.start_ms == pytest.approx(100.0)  # one iteration each
    # Rank r's first chunk starts after r idle iterations: the leading bubble is a gap.
    starts = [lane.bars[0].start_ms - lane.started_ms for lane in timeline.lanes if lane.started_ms is not None]
    assert starts == pytest.approx([0.0, 100.0, 200.0])


def test_times_are_relative_to_creation_and_markers_are_ordered() -> None:
    timeline = build_timeline("t1", pairs(pipelined()))
    kinds = [m.kind for m in timeline.markers]
    assert kinds == ["created", "assigned", "first_token", "cancel", "completed"]
    assert timeline.markers[0].at_ms == 0.0 and timeline.markers[1].at_ms == pytest.approx(10.0)
    assert timeline.status == "cancelled"
    assert timeline.decode is not None and (timeline.decode.chunks, timeline.decode.tokens) == (5, 10)
    assert timeline.end_ms >= timeline.decode.end_ms


def test_other_tasks_events_are_ignored() -> None:
    log = pipelined()
    log.task_created("t2")
    log.task_assigned("t2", "i1")
    timeline = build_timeline("t2", pairs(log))
    assert timeline.lanes == () and [m.kind for m in timeline.markers] == ["created", "assigned"]


def test_stack_heartbeats_mark_where_a_rank_got_stuck() -> None:
    timeline = build_timeline("t1", pairs(scenarios.compute_stall()))
    stuck = timeline.lanes[1]
    assert stuck.first_stack is not None and stuck.first_stack.stack is not None
    assert stuck.last_heartbeat is not None and stuck.last_heartbeat.phase_age_ms == 40_000
    assert any(m.kind == "stack" and m.rank == 1 for m in timeline.markers)


def test_the_api_path_reads_from_the_tasks_creation_and_diagnoses_with_the_live_state() -> None:
    log = scenarios.failed_with_error()
    state = scan(enumerate(log.records, 1)).state  # what the API's hub holds
    task = state.tasks[TaskId("t1")]
    assert task.created_seq > 1  # the instance and nodes came before: only the State knows them
    since_created = [
        (r.seq, r.event)
        for r in log.records
        if (r.stream == "events" and r.seq >= task.created_seq)
        or (r.stream == "telemetry" and r.event.env.wall_time >= task.created_at)
    ]
    timeline, findings = timeline_and_findings("t1", state, since_created, now_ns=log.now_ns)
    assert timeline == build_timeline("t1", pairs(log))  # nothing of the task is older than its creation
    assert [f.cause for f in findings] == ["rank_error"]
