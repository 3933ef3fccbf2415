"""`shoal replay`: fold the log and show one task's timeline, one instance's (its ranks and the
tasks each ran, batches included), or the cluster State at a point. Like `shoal diagnose`, it reads
`--file`, `--nats-url`, or, with neither, the configured cluster."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from events.ids import InstanceId, TaskId
from events.state import canonical_bytes
from services.ops.instance_timeline import InstanceTimelineBuilder
from services.ops.load import SkippedLines
from services.ops.nearest import unknown_id_message
from services.ops.offline import diagnose_scan, findings_for_instance, findings_for_task, heartbeats_of
from services.ops.render_html import render_timeline_html
from services.ops.render_instance import instance_timeline_text, render_instance_html
from services.ops.render_text import finding_text, state_text, timeline_text
from services.ops.scan import Cutoff, EventObserver, ScanResult, scan, wall_time_of_seq
from services.ops.sources import FileSource, LiveSource, SourceError, add_source_arguments, open_source, parse_at
from services.ops.timeline import TimelineBuilder


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "replay",
        help="fold the event log; print a task's or an instance's timeline, or the cluster State at a point",
        description="Fold the log (an export file, the NATS server at --nats-url, or by default the configured "
        "cluster) and print a task's timeline "
        "(--task), an instance's (--instance: one lane per rank, the tasks it ran as bars), the State "
        "as it was at an event sequence or time (--at), or a timeline and the State.",
    )
    add_source_arguments(parser, default_to_config=True)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--task", help="the task whose timeline to print")
    which.add_argument("--instance", help="the instance whose timeline to print (its ranks, the tasks of each)")
    parser.add_argument("--at", help="stop at this event sequence number or ISO time (e.g. 2026-01-01T12:00:05Z)")
    parser.add_argument("--json", action="store_true", help="print JSON for tools instead of text")
    parser.add_argument("--html", type=Path, metavar="OUT", help="also write the timeline's page to OUT")
    parser.set_defaults(handler=run)


def _cutoff(source: FileSource | LiveSource, at: str | None) -> Cutoff | None:
    if at is None:
        return None
    seq, wall_ns = parse_at(at)
    if seq is not None:
        wall_ns = wall_time_of_seq(source.records(), seq)  # cut telemetry at the same moment
    return Cutoff(seq=seq, wall_ns=wall_ns)


def run(args: argparse.Namespace) -> int:
    try:
        source = open_source(args)
        cutoff = _cutoff(source, args.at)
    except SourceError as exc:
        print(f"shoal replay: {exc}", file=sys.stderr)
        return 2
    if args.instance:
        return _replay_instance(args, source, cutoff)
    builder = TimelineBuilder(TaskId(args.task)) if args.task else None
    observers: list[EventObserver] = [builder] if builder is not None else []
    result = _scan(source, cutoff, observers)
    if builder is not None and not builder.seen:
        print(f"shoal replay: {unknown_id_message('task', args.task, result.state.tasks.keys())}", file=sys.stderr)
        return 2
    reference = int(time.time_ns()) if source.live and cutoff is None else result.newest_wall_ns
    if args.json:
        print(_json(args, result, builder, source.skipped or result.fold_error, reference).decode())
    else:
        print(_text(args, result, builder, reference))
    if builder is not None and args.html is not None:
        findings = findings_for_task(diagnose_scan(result, now_ns=reference, history=True), args.task)
        args.html.write_text(render_timeline_html(builder.build(), findings), encoding="utf-8")
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def _scan(source: FileSource | LiveSource, cutoff: Cutoff | None, observers: list[EventObserver]) -> ScanResult:
    result = scan(source.records(), cutoff=cutoff, observers=observers, abandon=source.abandon, allow_gaps=source.live)
    skipped = source.skipped or result.fold_error
    if skipped is not None:
        print(f"shoal replay: {skipped.describe()}; showing what came before", file=sys.stderr)
    return result


def _replay_instance(args: argparse.Namespace, source: FileSource | LiveSource, cutoff: Cutoff | None) -> int:
    builder = InstanceTimelineBuilder(InstanceId(args.instance))
    result = _scan(source, cutoff, [builder])
    if not builder.seen:
        known = result.state.instances.keys()
        print(f"shoal replay: {unknown_id_message('instance', args.instance, known)}", file=sys.stderr)
        return 2
    reference = int(time.time_ns()) if source.live and cutoff is None else result.newest_wall_ns
    findings = findings_for_instance(diagnose_scan(result, now_ns=reference, history=True), args.instance)
    timeline = builder.build()
    if args.json:
        print(
            msgspec.json.encode({"reference_wall_ns": reference, "timeline": timeline, "findings": findings}).decode()
        )
    else:
        print("\n\n".join([instance_timeline_text(timeline), *(finding_text(f) for f in findings)]))
    if args.html is not None:
        args.html.write_text(render_instance_html(timeline, findings), encoding="utf-8")
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def _text(args: argparse.Namespace, result: ScanResult, builder: TimelineBuilder | None, reference: int) -> str:
    parts: list[str] = []
    if builder is not None:
        parts.append(timeline_text(builder.build()))
        findings = findings_for_task(diagnose_scan(result, now_ns=reference, history=True), args.task)
        parts.extend(finding_text(f) for f in findings)
    if builder is None or args.at is not None:
        parts.append(state_text(result.state, heartbeats_of(result), reference))
    return "\n\n".join(parts)


def _json(
    args: argparse.Namespace,
    result: ScanResult,
    builder: TimelineBuilder | None,
    skipped: SkippedLines | None,
    reference: int,
) -> bytes:
    out: dict[str, Any] = {"reference_wall_ns": reference, "skipped": skipped}
    if builder is not None:
        out["timeline"] = builder.build()
        out["findings"] = findings_for_task(diagnose_scan(result, now_ns=reference, history=True), args.task)
    if builder is None or args.at is not None:
        out["state"] = msgspec.Raw(canonical_bytes(result.state))
        out["heartbeats"] = list(result.heartbeats.latest.values())
    return msgspec.json.encode(out)
