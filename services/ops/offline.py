"""The pipelines the commands (and the API) run: file -> scan -> diagnosis / timeline.

These glue the pure pieces together; all I/O here is reading one export file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from events.catalogue import AnyEvent
from events.ids import TaskId
from services.ops.diagnose import diagnose
from services.ops.findings import Diagnosis, Finding, Limits
from services.ops.load import ExportReader, SkippedLines
from services.ops.ranks import Heartbeats
from services.ops.scan import Cutoff, EventObserver, ScanResult, numbered, scan, stream_of, wall_time_of_seq
from services.ops.timeline import Timeline, TimelineBuilder


def scan_file(
    path: Path, *, cutoff: Cutoff | None = None, observers: Iterable[EventObserver] = ()
) -> tuple[ScanResult, SkippedLines | None]:
    """Fold an export file; the second value says what was not used (a bad line, an unfoldable event)."""
    reader = ExportReader(path)
    result = scan(reader, cutoff=cutoff, observers=observers, abandon=reader.abandon)
    return result, reader.skipped or result.fold_error


def resolve_seq_cutoff(path: Path, seq: int) -> Cutoff:
    """`--at SEQ`: cut events after `seq` and telemetry after that event's wall time."""
    reader = ExportReader(path)
    return Cutoff(seq=seq, wall_ns=wall_time_of_seq(reader, seq))


def heartbeats_of(result: ScanResult) -> Heartbeats:
    return Heartbeats(result.heartbeats.latest, result.heartbeats.by_task)


def diagnose_scan(
    result: ScanResult,
    *,
    now_ns: int | None = None,
    limits: Limits | None = None,
    skipped: SkippedLines | None = None,
) -> Diagnosis:
    """Findings for a scanned log; without `now_ns` the reference is the newest event (offline)."""
    reference = now_ns if now_ns is not None else result.newest_wall_ns
    findings = diagnose(result.state, heartbeats_of(result), reference, limits)
    return Diagnosis(
        reference_wall_ns=reference,
        reference="wall_clock" if now_ns is not None else "end_of_log",
        findings=tuple(findings),
        skipped=skipped.describe() if skipped is not None else None,
    )


def diagnose_file(path: Path, *, now_ns: int | None = None, limits: Limits | None = None) -> Diagnosis:
    result, skipped = scan_file(path)
    return diagnose_scan(result, now_ns=now_ns, limits=limits, skipped=skipped)


def findings_for_task(diagnosis: Diagnosis, task_id: str) -> list[Finding]:
    return [f for f in diagnosis.findings if f.task_id == task_id]


def timeline_and_findings(
    task_id: str, events: Iterable[tuple[int, AnyEvent]], *, limits: Limits | None = None, now_ns: int | None = None
) -> tuple[Timeline, list[Finding]]:
    """For the API's `/debug/timeline`: the task's timeline and its findings from any `(seq, event)` log.

    Give it the whole log (both streams) for a complete diagnosis; given only the task's own
    subjects it still draws the timeline, and the findings are whatever that much evidence shows.
    """
    builder = TimelineBuilder(TaskId(task_id))
    tapped = _tap(events, builder)
    result = scan(numbered(tapped, stream_of))
    for _ in tapped:
        pass  # the fold stopped early (a partial log): the timeline still gets every event
    diagnosis = diagnose_scan(result, now_ns=now_ns, limits=limits, skipped=result.fold_error)
    return builder.build(), findings_for_task(diagnosis, task_id)


def _tap(events: Iterable[tuple[int, AnyEvent]], builder: TimelineBuilder) -> Iterator[tuple[int, AnyEvent]]:
    for seq, event in events:
        builder.observe(seq, event)
        yield seq, event
