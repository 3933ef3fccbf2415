"""`shoal events tail|export|import`: watch, dump and restore the event log.

They connect to `nats_url`, or to the embedded server at nats_host:nats_port (`shoal nats`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any, BinaryIO

import msgspec

from eventlog.export import BadExportLine, read_export, split_streams, write_export
from eventlog.log import EventLog, LogError
from events.catalogue import AnyEvent, tag_of
from events.codec import ExportRecord
from events.subjects import task_events
from events.vocabulary import StreamKey
from services.config import (
    ConfigError,
    ShoalConfig,
    add_common_flags,
    config_from_args,
    log_settings,
)
from services.credentials import endpoint_for
from services.log_routing import configure_logging
from services.nats_permissions import Identity


def register(subparsers: Any) -> None:
    events = subparsers.add_parser("events", help="tail, export and import the event log")
    actions = events.add_subparsers(dest="events_action", metavar="ACTION", required=True)

    tail = actions.add_parser("tail", help="print events as they happen (human-readable)")
    add_common_flags(tail)
    tail.add_argument("--subject", action="append", help="only this subject (wildcards ok; repeatable)")
    tail.add_argument("--from-seq", type=int, default=None, help="start here instead of at new events")
    tail.add_argument("--telemetry", action="store_true", help="tail heartbeats (SHOAL_TELEMETRY) instead")
    tail.set_defaults(handler=_handler(_tail))

    export = actions.add_parser("export", help="write events as JSON Lines (one {stream, seq, event} per line)")
    add_common_flags(export)
    export.add_argument("--since", default=None, help="a sequence number or an ISO time (2025-01-31T12:00:00Z)")
    export.add_argument("--task", default=None, help="only the events of this task id")
    export.add_argument("--telemetry", action="store_true", help="also export heartbeats (SHOAL_TELEMETRY)")
    export.add_argument("-o", "--output", default="-", help="file to write (default: stdout)")
    export.set_defaults(handler=_handler(_export))

    imp = actions.add_parser("import", help="load an export file into empty streams, in order")
    add_common_flags(imp)
    imp.add_argument("file", help="a JSON Lines file written by `shoal events export`")
    imp.set_defaults(handler=_handler(_import))


def _handler(command: Callable[[EventLog, argparse.Namespace], Awaitable[int]]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            config = config_from_args(args).config
            configure_logging(config)
            return asyncio.run(_with_log(config, args, command))
        except (ConfigError, LogError, BadExportLine, ValueError) as exc:
            print(f"shoal events: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 0

    return run


async def _with_log(
    config: ShoalConfig, args: argparse.Namespace, command: Callable[[EventLog, argparse.Namespace], Awaitable[int]]
) -> int:
    admin = endpoint_for(config, Identity("admin"))  # operators' tools: the one identity that may import
    log = await EventLog.connect(admin, log_settings(config), name="shoal-events", wait_seconds=2)
    try:
        return await command(log, args)
    finally:
        await log.close()


def parse_since(text: str | None) -> tuple[int | None, datetime | None]:
    """`--since`: a sequence number, or an ISO 8601 time (naive = local time)."""
    if text is None:
        return None, None
    if text.isdigit():
        return int(text), None
    try:
        return None, datetime.fromisoformat(text).astimezone()
    except ValueError as exc:
        raise ValueError(f"--since {text!r}: give a sequence number or an ISO time like 2025-01-31T12:00:00Z") from exc


_fields = msgspec.json.Encoder()


def describe(seq: int, event: AnyEvent) -> str:
    """One human-readable line: seq, local time, type, the fields that matter."""
    at = datetime.fromtimestamp(event.env.wall_time / 1e9).strftime("%H:%M:%S.%f")[:-3]
    fields = msgspec.structs.asdict(event)
    fields.pop("env", None)
    shown = " ".join(f"{k}={_fields.encode(v).decode()}" for k, v in fields.items())
    if len(shown) > 200:
        shown = shown[:197] + "..."
    origin = event.env.origin
    who = (
        origin.service
        + (f"@{origin.node}" if origin.node else "")
        + (f"/r{origin.rank}" if origin.rank is not None else "")
    )
    return f"{seq:>8}  {at}  {tag_of(event):<22} {shown}  [{who}]"


async def _tail(log: EventLog, args: argparse.Namespace) -> int:
    stream: StreamKey = "telemetry" if args.telemetry else "events"
    start = args.from_seq if args.from_seq is not None else await log.last_seq(stream) + 1
    print(f"# tailing {log.url} {stream} from seq {start} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    async for seq, event in log.entries(start, subjects=args.subject, stream=stream, live=True):
        print(f"{seq:>8}  (malformed message skipped)" if event is None else describe(seq, event), flush=True)
    return 0


async def _export(log: EventLog, args: argparse.Namespace) -> int:
    from_seq, from_time = parse_since(args.since)
    subjects = [task_events(args.task)] if args.task else None
    out: BinaryIO = sys.stdout.buffer if args.output == "-" else open(args.output, "wb")  # noqa: SIM115
    try:
        count = 0
        async for record in _records(log, "events", from_seq, from_time, subjects):
            write_export((record,), out)
            count += 1
        if args.telemetry:
            async for record in _records(log, "telemetry", None, from_time, None):
                write_export((record,), out)
                count += 1
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    print(f"# exported {count} events", file=sys.stderr)
    return 0


async def _records(
    log: EventLog, stream: StreamKey, from_seq: int | None, from_time: datetime | None, subjects: list[str] | None
) -> AsyncIterator[ExportRecord]:
    async for seq, event, subject in log.deliveries(from_seq, subjects, stream=stream, live=False, from_time=from_time):
        yield ExportRecord(stream=stream, seq=seq, event=event, subject=subject.decode(errors="replace"))


async def _import(log: EventLog, args: argparse.Namespace) -> int:
    records = read_export(args.file)  # validates every line before anything is stored
    for stream in ("events", "telemetry"):
        if await log.message_count(stream) or await log.last_seq(stream):
            raise LogError(f"stream {stream} is not empty: import needs fresh streams (a new data dir or server)")
    events, telemetry = split_streams(records)
    for stream in ("events", "telemetry"):
        seqs = [r.seq for r in records if r.stream == stream]
        if seqs and seqs[0] > 1:
            await log.reset_stream(stream, first_seq=seqs[0])  # keep the original numbering
        if seqs and seqs[-1] - seqs[0] + 1 != len(seqs):
            print(
                f"# note: {stream} had gaps in its sequence; imported events are renumbered without gaps",
                file=sys.stderr,
            )
    # Each on the subject it was stored on: the subject is what the server checked against the
    # publisher, and the fold holds the event to it (a forged event stays quarantined).
    await log.append_many(events.events, events.subjects)
    await log.append_many(telemetry.events, telemetry.subjects)
    print(f"# imported {len(events.events)} events and {len(telemetry.events)} heartbeats", file=sys.stderr)
    return 0
