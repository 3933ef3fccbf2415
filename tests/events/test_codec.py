"""Every event kind survives msgpack and JSON round trips unchanged; bad bytes are named errors."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings

from events import codec
from events.catalogue import AnyEvent, InstancePlaced, LogEvent, TelemetryEvent
from events.runner_settings import RunnerSettings
from events.subjects import is_telemetry_subject, subject_for
from tests.events.strategies import event_strategy


def _kinds(union: object) -> set[type]:
    info = msgspec.inspect.type_info(union)  # pyright: ignore[reportArgumentType]
    assert isinstance(info, msgspec.inspect.UnionType)
    return {t.cls for t in info.types if isinstance(t, msgspec.inspect.StructType)}


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(event_strategy())
def test_msgpack_round_trip(event: AnyEvent) -> None:
    assert codec.decode_any_event(codec.encode(event)) == event


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(event_strategy())
def test_json_round_trip(event: AnyEvent) -> None:
    assert codec.from_json(codec.to_json(event)) == event
    record = codec.ExportRecord(stream="events", seq=7, event=event)
    assert codec.decode_record(codec.encode_record(record)) == record


_EVERY_KIND = sorted(_kinds(AnyEvent), key=lambda kind: kind.__name__)


def test_every_kind_is_a_log_or_a_telemetry_event() -> None:
    assert _kinds(AnyEvent) == _kinds(LogEvent) | _kinds(TelemetryEvent)
    assert not _kinds(LogEvent) & _kinds(TelemetryEvent)


@pytest.mark.parametrize("kind", _EVERY_KIND, ids=[kind.__name__ for kind in _EVERY_KIND])
def test_the_strategy_covers_every_kind(kind: type) -> None:
    """The round-trip tests above see every kind only if the strategy draws every kind."""
    drawn = find(
        event_strategy(),
        lambda event: type(event) is kind,
        settings=settings(max_examples=2000, database=None, phases=[Phase.generate]),
    )
    assert type(drawn) is kind


@settings(max_examples=100)
@given(event_strategy())
def test_log_and_telemetry_decoders_are_separate(event: AnyEvent) -> None:
    data = codec.encode(event)
    if type(event) in _kinds(LogEvent):
        assert codec.decode_log_event(data) == event
        with pytest.raises(codec.MalformedEvent):
            codec.decode_telemetry_event(data)
    else:
        assert codec.decode_telemetry_event(data) == event
        with pytest.raises(codec.MalformedEvent):
            codec.decode_log_event(data)


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1", msgspec.msgpack.encode({"type": "no_such_event"}), msgspec.msgpack.encode({"type": "task_created"})],
)
def test_malformed_bytes_raise_a_named_error(data: bytes) -> None:
    with pytest.raises(codec.MalformedEvent):
        codec.decode_log_event(data)


@settings(max_examples=200)
@given(event_strategy())
def test_subjects_route_telemetry_and_log_to_their_streams(event: AnyEvent) -> None:
    subject = subject_for(event)
    assert is_telemetry_subject(subject) == (type(event) in _kinds(TelemetryEvent))
    assert subject.startswith("shoal.")


_ENVELOPE = {"event_id": "e1", "origin": {"service": "master"}, "wall_time": 1, "mono_ns": 1}
_PLACED = {
    "type": "instance_placed",
    "env": _ENVELOPE,
    "instance_id": "i1",
    "model": "tiny",
    "shards": [{"node_id": "n1", "rank": 0, "start_layer": 0, "end_layer": 8}],
    "ring_hosts": ["127.0.0.1:5000"],
}


def test_an_instance_placed_written_before_runner_settings_still_decodes() -> None:
    old = {**_PLACED, "prefill_step_size": 64, "kv_bits": 8, "kv_group_size": 32}  # the flat fields of old logs
    event = codec.decode_log_event(msgspec.msgpack.encode(old))
    assert isinstance(event, InstancePlaced)
    assert (event.instance_id, event.model, event.ring_hosts) == ("i1", "tiny", ["127.0.0.1:5000"])
    assert event.settings == RunnerSettings()  # the old flat values are not carried over


def test_runner_settings_out_of_their_bounds_are_malformed() -> None:
    placed = {**_PLACED, "settings": {"prefill_step_size": 0}}
    with pytest.raises(codec.MalformedEvent, match="prefill_step_size"):
        codec.decode_log_event(msgspec.msgpack.encode(placed))
    placed = {**_PLACED, "settings": {"kv_bits": 5}}
    with pytest.raises(codec.MalformedEvent, match="kv_bits"):
        codec.decode_log_event(msgspec.msgpack.encode(placed))
