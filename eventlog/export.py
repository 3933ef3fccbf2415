"""Export files: JSON Lines, one `ExportRecord` (stream, seq, event) per line, readable by `jq`.

Reading is all-or-nothing: `read_export` validates every line (JSON, event type and fields,
sequences increasing within each stream, a kept subject within its stream's) before returning, and a bad line raises `BadExportLine`
with its line number, so an import never stores half a file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

import msgspec

from events.catalogue import AnyEvent, TelemetryEvent
from events.codec import ExportRecord, MalformedEvent, decode_record, encode_record
from events.fold import Folder
from events.state import State
from events.subjects import EVENTS_SUBJECTS, TELEMETRY_SUBJECTS
from events.vocabulary import StreamKey

_records = msgspec.json.Decoder(ExportRecord)
_TELEMETRY_TYPES = TelemetryEvent.__args__  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]
_SUBJECT_ROOT: dict[StreamKey, str] = {
    "events": EVENTS_SUBJECTS.removesuffix(">"),
    "telemetry": TELEMETRY_SUBJECTS.removesuffix(">"),
}


class BadExportLine(ValueError):
    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}; nothing was imported")
        self.path = path
        self.line = line
        self.reason = reason


def write_export(records: Iterable[ExportRecord], out: BinaryIO) -> int:
    """Write records as JSON Lines; returns how many."""
    count = 0
    for record in records:
        out.write(encode_record(record))
        out.write(b"\n")
        count += 1
    return count


def _lines(path: Path, block: int = 1 << 22) -> Iterator[tuple[int, bytes]]:
    """(line number, line) for every non-blank line, read in large blocks (folds read millions)."""
    number = 0
    tail = b""
    with path.open("rb") as handle:
        while chunk := handle.read(block):
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
            for line in lines:
                number += 1
                if line.strip():
                    yield number, line
    if tail.strip():
        yield number + 1, tail


def _check(record: ExportRecord) -> str | None:
    is_telemetry = isinstance(record.event, _TELEMETRY_TYPES)
    if is_telemetry != (record.stream == "telemetry"):
        return f"a {type(record.event).__name__} cannot belong to stream {record.stream!r}"
    if record.seq < 1:
        return f"seq must be 1 or more, got {record.seq}"
    if record.subject is not None and not record.subject.startswith(_SUBJECT_ROOT[record.stream]):
        return (
            f"subject {record.subject!r} is not one of stream {record.stream!r}'s ({_SUBJECT_ROOT[record.stream]}...)"
        )
    return None


def read_export(path: str | Path) -> list[ExportRecord]:
    """Every record of an export file, validated; `BadExportLine` on the first bad line."""
    path = Path(path)
    records: list[ExportRecord] = []
    last: dict[StreamKey, int] = {}
    for number, line in _lines(path):
        try:
            record = decode_record(line)
        except MalformedEvent as exc:
            raise BadExportLine(str(path), number, f"not a valid event record ({exc})") from exc
        problem = _check(record)
        if problem is None and record.seq <= last.get(record.stream, 0):
            problem = f"seq {record.seq} of stream {record.stream!r} does not follow seq {last[record.stream]}"
        if problem is not None:
            raise BadExportLine(str(path), number, problem)
        last[record.stream] = record.seq
        records.append(record)
    return records


class StreamRecords(NamedTuple):
    """One stream's part of an export, in file order: its events and the subject each was stored
    on (None where the export kept none)."""

    events: list[AnyEvent]
    subjects: list[str | None]


def split_streams(records: Iterable[ExportRecord]) -> tuple[StreamRecords, StreamRecords]:
    """The log's records and the telemetry's, each in file order."""
    log, telemetry = StreamRecords([], []), StreamRecords([], [])
    for record in records:
        part = telemetry if isinstance(record.event, _TELEMETRY_TYPES) else log
        part.events.append(record.event)
        part.subjects.append(record.subject)
    return log, telemetry


def fold_export(path: str | Path, state: State | None = None) -> State:
    """Fold the SHOAL_EVENTS records of an export file offline (no NATS).

    The loop is inlined (no per-line generator or wrapper call): it is the offline fold's hot path.
    """
    folder = Folder(state)
    add = folder.add
    decode = _records.decode
    number = 0
    tail = b""
    first = True  # before the first event: a trimmed head is stepped over there, once
    with Path(path).open("rb") as handle:
        while True:
            chunk = handle.read(1 << 22)
            lines = (tail + chunk).split(b"\n")
            tail = b"" if not chunk else lines.pop()
            for line in lines:
                number += 1
                try:
                    record = decode(line)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    if not line.strip():
                        continue
                    raise BadExportLine(str(path), number, f"not a valid event record ({exc})") from exc
                if record.stream == "events":
                    if first:
                        first = False
                        if folder.last_seq == 0 and record.seq > 1:
                            folder.skip_to(record.seq)  # the stream's head was trimmed
                    add(record.seq, record.event, record.subject)  # pyright: ignore[reportArgumentType]
            if not chunk:
                return folder.state
