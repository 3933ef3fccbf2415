"""The log's NATS protocol reader, fed crafted bytes (no server): framing, ordering checks, control."""

from __future__ import annotations

import asyncio

import pytest

from eventlog.consume import ConsumerRestart, StreamReader
from eventlog.wire import Wire, WireError, split_servers

SID = 7


class FakeWire(Wire):
    """A Wire whose socket reads return the given chunks, one per read."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = list(chunks)
        self._out = bytearray()
        self._in = b""
        self._next_sid = 0
        self._pongs = 0

        self.flushed = b""

    async def read_data(self) -> bytes:
        data = self._chunks.pop(0)
        buf, self._in = self._in + data, b""
        return buf

    async def flush(self) -> None:
        self.flushed += bytes(self._out)
        self._out = bytearray()

    @property
    def sent(self) -> bytes:
        return self.flushed + bytes(self._out)


def delivery(seq: int, dseq: int, pending: int, payload: bytes = b"x", *, v2: bool = False, sid: int = SID) -> bytes:
    if v2:
        reply = f"$JS.ACK.dom.acc.SHOAL_EVENTS.c1.1.{seq}.{dseq}.17000.{pending}.tok"
    else:
        reply = f"$JS.ACK.SHOAL_EVENTS.c1.1.{seq}.{dseq}.17000.{pending}"
    headers = f"NATS/1.0\r\nNats-Msg-Id: id-{seq}\r\n\r\n".encode()
    line = f"HMSG shoal.ev.task.t.chunk_generated {sid} {reply} {len(headers)} {len(headers) + len(payload)}\r\n"
    return line.encode() + headers + payload + b"\r\n"


def reader(chunks: list[bytes], *, live: bool = True) -> tuple[StreamReader, FakeWire]:
    wire = FakeWire(chunks)
    stream_reader = StreamReader(wire, "SHOAL_EVENTS", [], live=live)
    stream_reader._sid = SID  # pyright: ignore[reportPrivateUsage]
    return stream_reader, wire


def next_batch(stream_reader: StreamReader, end: int = 0) -> tuple[list[tuple[int, bytes, bytes]], bool]:
    return asyncio.run(stream_reader._next(end))  # pyright: ignore[reportPrivateUsage]


def test_generic_frames_and_control_lines() -> None:
    wire = FakeWire([])
    frame = b"MSG a.b 3 _INBOX.x 5\r\nhello\r\nPING\r\nHMSG c 4 12 14\r\nNATS/1.0\r\n\r\nhi\r\n+OK\r\n"
    message, pos = wire.parse_frame(frame, 0)
    assert message == (3, b"a.b", b"_INBOX.x", b"", b"hello")
    message, pos = wire.parse_frame(frame, pos)
    assert message is None and wire.sent == b"PONG\r\n"
    message, pos = wire.parse_frame(frame, pos)
    assert message == (4, b"c", b"", b"NATS/1.0\r\n\r\n", b"hi")
    assert wire.parse_frame(frame, pos) == (None, len(frame))
    assert wire.parse_frame(b"MSG a 1 10\r\nshort", 0) == (None, -1)
    assert wire.parse_frame(b"PIN", 0) == (None, -1)
    with pytest.raises(WireError, match="Authorization"):
        wire.parse_frame(b"-ERR 'Authorization Violation'\r\n", 0)


def test_in_order_deliveries_across_split_reads() -> None:
    data = b"".join(delivery(s, s - 9, 100 - s, f"p{s}".encode()) for s in range(10, 15))
    cut = len(data) // 2 + 3  # a frame split in the middle
    stream_reader, _ = reader([data[:cut], data[cut:]])
    first, _ = next_batch(stream_reader)
    second, _ = next_batch(stream_reader)
    got = first + second
    assert [seq for seq, _, _ in got] == list(range(10, 15))
    assert got[0] == (10, b"shoal.ev.task.t.chunk_generated", b"p10")


def test_a_bounded_read_stops_at_pending_zero_or_the_end_seq() -> None:
    stream_reader, _ = reader([delivery(1, 1, 1) + delivery(2, 2, 0) + delivery(3, 3, 0)], live=False)
    out, done = next_batch(stream_reader, end=10)
    assert done and [seq for seq, _, _ in out] == [1, 2]
    stream_reader, _ = reader([delivery(5, 1, 9) + delivery(6, 2, 8)], live=False)
    out, done = next_batch(stream_reader, end=5)
    assert done and [seq for seq, _, _ in out] == [5]


def test_a_delivery_gap_restarts_the_consumer() -> None:
    stream_reader, _ = reader([delivery(1, 1, 5) + delivery(3, 3, 3)])
    with pytest.raises(ConsumerRestart, match="delivery gap"):
        next_batch(stream_reader)
    stream_reader, _ = reader([delivery(1, 1, 5), delivery(2, 3, 3)])
    next_batch(stream_reader)
    with pytest.raises(ConsumerRestart):
        next_batch(stream_reader)


def test_flow_control_is_answered_and_a_heartbeat_reporting_unseen_deliveries_restarts() -> None:
    flow = b"HMSG _INBOX.d 7 $JS.FC.SHOAL_EVENTS.x.1 34 34\r\nNATS/1.0 100 FlowControl Request\r\n\r\n\r\n"
    stream_reader, wire = reader([delivery(1, 1, 0) + flow + delivery(2, 2, 0)])
    out, _ = next_batch(stream_reader)
    assert [seq for seq, _, _ in out] == [1, 2]
    assert b"PUB $JS.FC.SHOAL_EVENTS.x.1 0\r\n" in wire.sent
    beat = b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 5\r\nNats-Last-Stream: 5\r\n\r\n"
    frame = f"HMSG _INBOX.d 7 {len(beat)} {len(beat)}\r\n".encode() + beat + b"\r\n"
    stream_reader, _ = reader([delivery(1, 1, 4) + frame])
    with pytest.raises(ConsumerRestart, match="heartbeat says delivery 5"):
        next_batch(stream_reader)


def test_v2_reply_layout_and_other_subscriptions_take_the_slow_path() -> None:
    other = delivery(99, 1, 0, sid=8)
    stream_reader, _ = reader([delivery(1, 1, 2, v2=True) + other + delivery(2, 2, 1) + delivery(3, 3, 0, v2=True)])
    out, _ = next_batch(stream_reader)
    assert [seq for seq, _, _ in out] == [1, 2, 3]


def test_server_urls() -> None:
    assert split_servers("nats://a:1, nats://u:p@b:2,c") == [
        ("a", 1, {}),
        ("b", 2, {"user": "u", "pass": "p"}),
        ("c", 4222, {}),
    ]
    assert split_servers("nats://tok@h:5") == [("h", 5, {"auth_token": "tok"})]
    with pytest.raises(ValueError, match="scheme"):
        split_servers("http://h:1")
