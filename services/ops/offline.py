"""The pipelines the commands (and the API) run: file -> scan -> diagnosis / timeline.

These glue the pure pieces together; all I/O here is reading one export file.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from events.catalogue import AnyEvent, RunnerHeartbeat
from events.ids import InstanceId, TaskId
from events.state import State
from services.ops.diagnose import diagnose
from services.ops.findings import Diagnosis, Finding, Limits
from services.ops.instance_timeline import InstanceTimeline, InstanceTimelineBuilder
from services.ops.load import ExportReader, SkippedLines
from services.ops.ranks import Heartbeats
from services.ops.runs import Runs, label_runs
from services.ops.scan import Cutoff, EventObserver, HeartbeatIndex, ScanResult, scan
from services.ops.timeline import Timeline, TimelineBuilder


def scan_file(
    path: Path, *, cutoff: Cutoff | None = None, observers: Iterable[EventObserver] = ()
) -> tuple[ScanResult, SkippedLines | None]:
    """Fold an export file; the second value says what was not used (a bad line, an unfoldable event)."""
    reader = ExportReader(path)
    result = scan(reader, cutoff=cutoff, observers=observers, abandon=reader.abandon)
    return result, reader.skipped or result.fold_error


def heartbeats_of(result: ScanResult) -> Heartbeats:
    beats = result.heartbeats
    return Heartbeats(beats.latest, beats.by_task, beats.peers_at, beats.positions)


def diagnose_scan(
    result: ScanResult,
    *,
    now_ns: int | None = None,
    limits: Limits | None = None,
    skipped: SkippedLines | None = None,
    history: bool = False,
) -> Diagnosis:
    """Findings for a scanned log; without `now_ns` the reference is the newest event (offline).
    Only the current run's, unless `history` (each finding says its run either way)."""
    reference = now_ns if now_ns is not None else result.newest_wall_ns
    runs = Runs(result.runs)
    findings = label_runs(diagnose(result.state, heartbeats_of(result), reference, limits), result.state, runs)
    # Oldest run first (stable: within a run, diagnose's own order).
    shown = sorted(findings, key=lambda f: f.run) if history else [f for f in findings if f.run == runs.current]
    return Diagnosis(
        reference_wall_ns=reference,
        reference="wall_clock" if now_ns is not None else "end_of_log",
        findings=tuple(shown),
        skipped=skipped.describe() if skipped is not None else None,
        run=runs.current,
        run_started_wall_ns=runs.starts[-1].wall_ns if runs.starts else 0,
        history=history,
        earlier_findings=len(findings) - len(shown),
    )


def diagnose_file(
    path: Path, *, now_ns: int | None = None, limits: Limits | None = None, history: bool = False
) -> Diagnosis:
    result, skipped = scan_file(path)
    return diagnose_scan(result, now_ns=now_ns, limits=limits, skipped=skipped, history=history)


def findings_for_task(diagnosis: Diagnosis, task_id: str) -> list[Finding]:
    return [f for f in diagnosis.findings if f.task_id == task_id]


def findings_for_instance(diagnosis: Diagnosis, instance_id: str) -> list[Finding]:
    return [f for f in diagnosis.findings if f.instance_id == instance_id]


def timeline_and_findings(
    task_id: str, state: State, events: Iterable[tuple[int, AnyEvent]], *, now_ns: int, limits: Limits | None = None
) -> tuple[Timeline, list[Finding]]:
    """For the API's `/debug/timeline`: the task's timeline from `events`, and its findings from
    `state` (the API's live fold: the log is not folded again) and the heartbeats among `events`.

    `events` need only start at the task's creation (both streams): the timeline has nothing
    before it, and the diagnosis takes the instance and the nodes from `state`.
    """
    builder = TimelineBuilder(TaskId(task_id))
    findings = diagnose(state, _observe(builder, events), now_ns, limits)
    return builder.build(), [f for f in findings if f.task_id == task_id]


def instance_timeline_and_findings(
    instance_id: str,
    state: State,
    events: Iterable[tuple[int, AnyEvent]],
    *,
    now_ns: int,
    limits: Limits | None = None,
) -> tuple[InstanceTimeline, list[Finding]]:
    """For `/debug/timeline?instance=`: as `timeline_and_findings`, for an instance. `events` may
    be a window of the log: the tasks on the instance are also taken from `state`."""
    on_it = [t.task_id for t in state.tasks.values() if t.instance_id == instance_id]
    builder = InstanceTimelineBuilder(InstanceId(instance_id), on_it)
    findings = diagnose(state, _observe(builder, events), now_ns, limits)
    return builder.build(), [f for f in findings if f.instance_id == instance_id]


def _observe(builder: EventObserver, events: Iterable[tuple[int, AnyEvent]]) -> Heartbeats:
    """Feed `events` to `builder`; the newest heartbeats among them, for the diagnosis."""
    beats = HeartbeatIndex()
    for seq, event in events:
        builder.observe(seq, event)
        if isinstance(event, RunnerHeartbeat):
            beats.add(event)
    return Heartbeats(beats.latest, beats.by_task, beats.peers_at, beats.positions)
