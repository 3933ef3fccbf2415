"""`shoal diagnose`: every stuck or badly ended task/instance, where it stopped and what to do.

It reads `--file` (an export), `--nats-url` (a server), or, with neither, the configured cluster.
Exit status: 0 nothing wrong, 1 findings, 2 the log could not be read.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import msgspec

from services.ops.findings import Limits
from services.ops.offline import diagnose_scan
from services.ops.render_text import diagnosis_text
from services.ops.scan import scan
from services.ops.sources import SourceError, add_source_arguments, open_source, parse_at


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "diagnose",
        help="find stuck or failed tasks and instances in the event log and say why",
        description="Fold the log (an export file, the NATS server at --nats-url, or by default the configured "
        "cluster) and report, for every task or instance that is stuck or ended badly, "
        "the stuck ranks, their phase and iteration, the last heartbeat and stack, the likely cause and "
        "what to do next. Exit 0: nothing wrong; 1: findings; 2: the log could not be read.",
    )
    add_source_arguments(parser, default_to_config=True)
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.add_argument(
        "--history",
        action="store_true",
        help="also report findings of earlier runs on this log (each `shoal up` starts a run; by default "
        "only the current run's are reported, and the exit status is theirs)",
    )
    parser.add_argument(
        "--now", help="judge staleness at this ISO time (default: the wall clock live, the log's end offline)"
    )
    defaults = Limits()
    parser.add_argument(
        "--stuck-after",
        type=float,
        default=defaults.stuck_after_s,
        metavar="S",
        help="a task quiet this many seconds is stuck (default %(default)s)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=defaults.heartbeat_timeout_s,
        metavar="S",
        help="a rank silent this long while others beat is dead (default %(default)s)",
    )
    parser.add_argument(
        "--stall-after",
        type=float,
        default=defaults.stall_phase_s,
        metavar="S",
        help="a phase older than this is a stall (default %(default)s)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    try:
        source = open_source(args)
        now_ns = parse_at(args.now)[1] if args.now else None
    except SourceError as exc:
        print(f"shoal diagnose: {exc}", file=sys.stderr)
        return 2
    if now_ns is None and source.live:
        now_ns = time.time_ns()
    limits = Limits(
        stuck_after_s=args.stuck_after, heartbeat_timeout_s=args.heartbeat_timeout, stall_phase_s=args.stall_after
    )
    result = scan(source.records(), abandon=source.abandon, allow_gaps=source.live)
    skipped = source.skipped or result.fold_error
    diagnosis = diagnose_scan(result, now_ns=now_ns, limits=limits, skipped=skipped, history=args.history)
    if skipped is not None:
        print(f"shoal diagnose: {skipped.describe()}; diagnosed what came before", file=sys.stderr)
    if args.json:
        print(msgspec.json.encode(diagnosis).decode())
    else:
        print(diagnosis_text(diagnosis))
    return 1 if diagnosis.findings else 0
