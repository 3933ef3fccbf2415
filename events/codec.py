"""One codec, built once: msgpack on the wire, JSON Lines for export.

Decoding is strict and typed. `decode_*` raise `MalformedEvent` (never a msgspec internal
error) so edges can log, count and skip a poison message.
"""

from __future__ import annotations

import msgspec

from events.catalogue import AnyEvent, LogEvent, TelemetryEvent
from events.vocabulary import StreamKey


class MalformedEvent(ValueError):
    """Bytes that are not a valid shoal event (bad encoding, unknown type, wrong field types)."""


class ExportRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """One line of an export file: which stream, its sequence there, and the event."""

    stream: StreamKey
    seq: int
    event: AnyEvent
    # The subject it was stored on, which the server checked against its publisher: an offline fold
    # holds the event to it as a live one does (`events.fold`). None: a log made offline, or an
    # export written before subjects were kept.
    subject: str | None = None


_msgpack_encoder = msgspec.msgpack.Encoder()
_log_decoder = msgspec.msgpack.Decoder(LogEvent)
_telemetry_decoder = msgspec.msgpack.Decoder(TelemetryEvent)
_any_decoder = msgspec.msgpack.Decoder(AnyEvent)
_json_encoder = msgspec.json.Encoder()
_record_decoder = msgspec.json.Decoder(ExportRecord)
_any_json_decoder = msgspec.json.Decoder(AnyEvent)


def encode(event: AnyEvent) -> bytes:
    return _msgpack_encoder.encode(event)


def decode_log_event(data: bytes) -> LogEvent:
    try:
        return _log_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedEvent(str(exc)) from exc


def decode_telemetry_event(data: bytes) -> TelemetryEvent:
    try:
        return _telemetry_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedEvent(str(exc)) from exc


def decode_any_event(data: bytes) -> AnyEvent:
    try:
        return _any_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedEvent(str(exc)) from exc


def to_json(event: AnyEvent) -> bytes:
    return _json_encoder.encode(event)


def from_json(data: bytes | str) -> AnyEvent:
    try:
        return _any_json_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedEvent(str(exc)) from exc


def encode_record(record: ExportRecord) -> bytes:
    """One JSON line (without the newline)."""
    return _json_encoder.encode(record)


def decode_record(line: bytes | str) -> ExportRecord:
    try:
        return _record_decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedEvent(str(exc)) from exc
