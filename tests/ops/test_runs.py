"""A log that outlives two `shoal up` runs: the diagnosis of now reports the current run only,
and `--history` both runs, each finding labelled with its run."""

from __future__ import annotations

import msgspec

from events.catalogue import ClusterStarted, Envelope, Origin
from events.ids import EventId
from services.ops.findings import Diagnosis
from services.ops.offline import diagnose_scan
from services.ops.render_text import diagnosis_text
from services.ops.scan import scan
from services.ops.synthetic import LogBuilder


def _two_runs(*, first_run_marked: bool = True) -> LogBuilder:
    log = LogBuilder()
    if first_run_marked:
        log.cluster_started()
    log.node_joined("n1")
    log.ready_instance("i1", ["n1"])
    log.task_created("old")
    log.task_assigned("old", "i1")
    log.failed("old", "RuntimeError: [ring] Accept failed (error: 4)", rank=0)  # a Ctrl-C while loading
    log.advance(3600)
    log.cluster_started()
    log.node_joined("n1")
    log.ready_instance("i2", ["n1"])
    log.task_created("new")
    log.task_assigned("new", "i2")
    log.failed("new", "ValueError: boom", rank=0)
    return log


def _diagnosis(log: LogBuilder, *, history: bool) -> Diagnosis:
    return diagnose_scan(scan(enumerate(log.records, 1)), history=history)


def test_now_is_the_current_run_only() -> None:
    diagnosis = _diagnosis(_two_runs(), history=False)
    assert [(f.subject, f.run) for f in diagnosis.findings] == [("new", 2)]
    assert (diagnosis.run, diagnosis.earlier_findings, diagnosis.history) == (2, 1, False)
    text = diagnosis_text(diagnosis)
    assert "current run: 2" in text and "1 finding(s) of earlier runs not shown (--history shows them)" in text
    assert "(run 2) [rank_error] task new" in text and "task old" not in text


def test_history_shows_every_run_labelled() -> None:
    diagnosis = _diagnosis(_two_runs(), history=True)
    assert [(f.subject, f.run) for f in diagnosis.findings] == [("old", 1), ("new", 2)]
    assert diagnosis.earlier_findings == 0
    text = diagnosis_text(diagnosis)
    assert "(run 1) [rank_error] task old" in text and "(run 2) [rank_error] task new" in text
    assert "findings of every run" in text
    as_json = msgspec.json.decode(msgspec.json.encode(diagnosis))
    assert [f["run"] for f in as_json["findings"]] == [1, 2]


def test_a_log_from_before_the_first_marker_is_run_0() -> None:
    diagnosis = _diagnosis(_two_runs(first_run_marked=False), history=True)
    assert [(f.subject, f.run) for f in diagnosis.findings] == [("old", 0), ("new", 1)]


def test_a_log_without_runs_is_all_now_and_unlabelled() -> None:
    log = LogBuilder()
    log.node_joined("n1")
    log.ready_instance("i1", ["n1"])
    log.task_created("t1")
    log.task_assigned("t1", "i1")
    log.failed("t1", "ValueError: boom", rank=0)
    diagnosis = _diagnosis(log, history=False)
    assert [(f.subject, f.run) for f in diagnosis.findings] == [("t1", 0)]
    text = diagnosis_text(diagnosis)
    assert "current run" not in text and "(run" not in text


def test_instances_and_quarantined_events_belong_to_the_run_they_came_in() -> None:
    log = LogBuilder()
    log.cluster_started()
    log.node_joined("n1")
    log.instance_placed("stuck", ["n1"])
    log.runner_status("stuck", 0, "loading")
    log.record(
        ClusterStarted(env=Envelope(event_id=EventId("forged"), origin=Origin(service="api"), wall_time=1, mono_ns=1))
    )
    log.advance(700)
    log.cluster_started()
    diagnosis = _diagnosis(log, history=True)
    assert [(f.kind, f.cause, f.run) for f in diagnosis.findings] == [
        ("instance", "instance_not_ready", 1),
        ("event", "quarantined_event", 1),
    ]
    assert _diagnosis(log, history=False).findings == ()
