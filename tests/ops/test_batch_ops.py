"""Diagnose and the timelines on logs of a batched instance: a rank that stalls holds every task
of its batch, and each gets a finding naming it; a task's timeline keeps its ranks' heartbeats
when they are about the whole batch."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from events.catalogue import TaskFailed
from services.cli import main
from services.ops.instance_timeline import build_instance_timeline
from services.ops.offline import diagnose_scan
from services.ops.render_instance import instance_timeline_text, render_instance_html
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


def test_the_instance_timeline_has_a_lane_per_rank_and_a_row_per_task_running_at_once() -> None:
    log = batch_scenarios.batch_completed()
    timeline = build_instance_timeline("i1", [(r.seq, r.event) for r in log.records])
    assert [lane.rank for lane in timeline.lanes] == [0, 1]
    assert timeline.tasks == 2 and timeline.most_at_once == 2
    for lane in timeline.lanes:
        t1, t2 = lane.bars
        assert (t1.task_id, t2.task_id, t1.row, t2.row) == ("t1", "t2", 0, 1)
        assert t1.start_ms < t2.start_ms < t1.end_ms  # t2 joined while t1 ran: the batch
        assert t1.prefill_done_ms is not None and t1.start_ms < t1.prefill_done_ms < t1.end_ms
        assert (t1.status, t1.tokens, t2.status, t2.tokens) == ("completed", 10, "completed", 10)
        assert lane.batch == ("t1", "t2")


def test_tasks_one_after_another_share_a_row() -> None:
    log = batch_scenarios.one_after_another()
    timeline = build_instance_timeline("i1", [(r.seq, r.event) for r in log.records])
    assert timeline.most_at_once == 1
    assert [(bar.task_id, bar.row) for bar in timeline.lanes[1].bars] == [("t1", 0), ("t2", 0)]


def test_the_instance_timeline_of_a_stall_marks_the_stuck_ranks_and_the_retirement() -> None:
    log = batch_scenarios.batch_rank_stalls_in_compute()
    timeline = build_instance_timeline("i1", [(r.seq, r.event) for r in log.records])
    assert all(bar.status == "failed" for lane in timeline.lanes for bar in lane.bars)
    kinds = [(m.kind, m.rank) for m in timeline.markers]
    assert ("stack", 0) in kinds and ("stack", 1) in kinds and ("stalled", None) in kinds
    page = render_instance_html(timeline)
    assert page.count('class="task"') == 4 and "retired (stalled)" in page
    text = instance_timeline_text(timeline)
    assert "rank 1: 2 tasks in 2 rows" in text and "batch t1, t2" in text


def test_replay_prints_an_instances_timeline_and_its_findings(
    export_file: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(export_file(batch_scenarios.batch_rank_stalls_in_compute()))
    html = tmp_path / "i1.html"
    assert main(["replay", "--file", path, "--instance", "i1", "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("instance i1  model tiny") and out.count("[stalled_in_compute] task") == 2
    assert html.read_text().count('class="task"') == 4
    assert main(["replay", "--file", path, "--instance", "i1", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["timeline"]["lanes"]) == 2
    assert main(["replay", "--file", path, "--instance", "i9"]) == 2
    assert "nearest: i1" in capsys.readouterr().err


def test_the_instance_timeline_says_how_much_of_the_kv_its_batch_reserves() -> None:
    """An operator asking why queued tasks wait sees each rank's newest word on its batch's KV."""
    log = batch_scenarios.batch_completed()
    log.heartbeat("i1", 1, "decode", "t1", 11, 0.01, batch=batch_scenarios.BATCH, kv=(1200, 4096))
    timeline = build_instance_timeline("i1", [(r.seq, r.event) for r in log.records])
    assert [lane.kv for lane in timeline.lanes] == [None, (1200, 4096)]
    assert "rank 1: 2 tasks in 2 rows" in (text := instance_timeline_text(timeline))
    assert "KV 1,200 of 4,096 tokens reserved" in text
