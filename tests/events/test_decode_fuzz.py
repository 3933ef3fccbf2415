"""The decoders are an edge the network reaches: whatever the bytes, they give a valid event or
`MalformedEvent`, never another exception, and an id that is not a subject token never decodes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events import codec
from events.catalogue import AnyEvent
from events.ids import ID_PATTERN
from tests.events.strategies import event_strategy

DECODERS = (
    codec.decode_log_event,
    codec.decode_telemetry_event,
    codec.decode_any_event,
    codec.from_json,
    codec.decode_record,
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decodes_or_is_malformed(data: bytes) -> None:
    for decode in DECODERS:
        try:
            decode(data)
        except codec.MalformedEvent:
            pass


@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_bytes_decode_or_are_malformed(data: bytes) -> None:
    _decodes_or_is_malformed(data)


# Values shaped like events (maps with a real tag, nested lists, odd scalars) reach deeper into
# the decoders than random bytes do.
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1), st.floats(), st.text(max_size=8)
)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
)


@FUZZ
@given(
    st.sampled_from(["task_created", "chunk_generated", "instance_placed", "runner_heartbeat", "nope"]),
    st.dictionaries(st.sampled_from(["env", "task_id", "rank", "shards", "messages", "x"]), _values, max_size=5),
)
def test_event_shaped_values_decode_or_are_malformed(tag: str, fields: dict[str, Any]) -> None:
    value = {"type": tag, **fields}
    _decodes_or_is_malformed(msgspec.msgpack.encode(value))
    _decodes_or_is_malformed(msgspec.json.encode(value))
    _decodes_or_is_malformed(msgspec.json.encode({"stream": "events", "seq": 1, "event": value}))


@FUZZ
@given(event_strategy(), st.data())
def test_damaged_encodings_of_real_events_decode_or_are_malformed(event: AnyEvent, data: st.DataObject) -> None:
    for encoded in (codec.encode(event), codec.to_json(event)):
        cut = data.draw(st.integers(min_value=0, max_value=len(encoded)))
        flip = data.draw(st.integers(min_value=0, max_value=max(0, len(encoded) - 1)))
        damaged = bytearray(encoded[:cut] + encoded[cut + 1 :])  # one byte dropped
        if damaged:
            damaged[min(flip, len(damaged) - 1)] ^= data.draw(st.integers(min_value=1, max_value=255))
        _decodes_or_is_malformed(bytes(damaged))


@pytest.mark.parametrize(
    "data",
    [
        b"\xdd\xff\xff\xff\xff",  # an array that claims 4 billion items
        b"\xdf\xff\xff\xff\xff",  # a map that claims 4 billion pairs
        b"\xdb\xff\xff\xff\xff",  # a string that claims 4 GiB
        b"\x91" * 100_000,  # nesting far deeper than any event
        b"[" * 100_000,
    ],
)
def test_lying_lengths_and_deep_nesting_are_malformed_without_allocating(data: bytes) -> None:
    _decodes_or_is_malformed(data)


_CREATED = {
    "type": "task_created",
    "env": {"event_id": "e1", "origin": {"service": "api"}, "wall_time": 1, "mono_ns": 1},
    "task_id": "t1",
    "model": "tiny",
    "messages": [],
}


@pytest.mark.parametrize("bad", ["", "a.b", "a b", "*", ">", "a>", "ab\n", "x" * 129, "é"])
def test_an_id_that_is_not_a_subject_token_is_malformed(bad: str) -> None:
    assert codec.decode_log_event(msgspec.msgpack.encode(_CREATED)).task_id == "t1"  # type: ignore[union-attr]
    with pytest.raises(codec.MalformedEvent, match="task_id"):
        codec.decode_log_event(msgspec.msgpack.encode({**_CREATED, "task_id": bad}))


@pytest.mark.parametrize("bad", ["", "a b", "e\r\nX-Injected: 1", "x" * 257])
def test_an_event_id_that_cannot_be_a_header_is_malformed(bad: str) -> None:
    envelope = {**_CREATED["env"], "event_id": bad}  # pyright: ignore[reportGeneralTypeIssues]
    with pytest.raises(codec.MalformedEvent, match="event_id"):
        codec.decode_log_event(msgspec.msgpack.encode({**_CREATED, "env": envelope}))


def _id_fields(info: msgspec.inspect.Type, path: str, seen: set[type]) -> list[tuple[str, msgspec.inspect.Type]]:
    """Every struct field named *_id in the catalogue, wherever it is nested."""
    match info:
        case msgspec.inspect.UnionType():
            return [f for t in info.types for f in _id_fields(t, path, seen)]
        case msgspec.inspect.ListType():
            return _id_fields(info.item_type, path, seen)
        case msgspec.inspect.StructType() if info.cls not in seen:
            seen.add(info.cls)
            found: list[tuple[str, msgspec.inspect.Type]] = []
            for field in info.fields:
                where = f"{info.cls.__name__}.{field.name}"
                if field.name.endswith("_id") and field.name != "event_id":
                    found.append((where, field.type))
                found += _id_fields(field.type, where, seen)
            return found
        case _:
            return []


def _is_token(info: msgspec.inspect.Type) -> bool:
    if isinstance(info, msgspec.inspect.Metadata):  # the description rides along the pattern
        return _is_token(info.type)
    if isinstance(info, msgspec.inspect.UnionType):
        return all(_is_token(t) for t in info.types if not isinstance(t, msgspec.inspect.NoneType))
    return isinstance(info, msgspec.inspect.StrType) and info.pattern == ID_PATTERN


# `*_id` fields that never name a subject: a client's own tool call id (echoed back, free text in
# OpenAI's API) and a vocabulary index.
NOT_SUBJECT_IDS = frozenset({"ChatMessage.tool_call_id", "TokenLogprob.token_id", "TopLogprob.token_id"})


def test_every_id_in_every_event_is_checked_by_the_decoder() -> None:
    """A new `*_id: TaskId` field (the NewType, not `TaskIdField`) would skip the check: caught here."""
    fields = _id_fields(msgspec.inspect.type_info(AnyEvent), "", set())  # pyright: ignore[reportArgumentType]
    assert len(fields) >= 15
    unchecked = [where for where, info in fields if not _is_token(info) and where not in NOT_SUBJECT_IDS]
    assert unchecked == []
