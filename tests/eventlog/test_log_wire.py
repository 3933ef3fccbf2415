"""The log's NATS connection and ordered reader, fed crafted bytes (no server): ordering checks,
flow control, heartbeats, -ERR. The frame parser itself is tested in test_frames.py."""

from __future__ import annotations

import asyncio

import pytest

from eventlog.consume import ConsumerRestart, StreamReader
from eventlog.frames import Msg
from eventlog.wire import Wire, WireError, request, split_servers

SID = 7


class FakeWire(Wire):
    """A Wire whose socket reads return the given chunks, one per read, and whose sends are kept."""

    def __init__(self, chunks: list[bytes]) -> None:
        super().__init__(None, None)  # pyright: ignore[reportArgumentType]  (the socket methods are replaced)
        self._chunks = list(chunks)
        self.flushed = b""

    async def _receive(self) -> bytes:
        return self._chunks.pop(0)

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
    stream_reader._sid = str(SID).encode()  # pyright: ignore[reportPrivateUsage]
    return stream_reader, wire


def next_batch(stream_reader: StreamReader, end: int = 0) -> tuple[list[tuple[int, bytes, bytes]], bool]:
    """(seq, subject, payload) of the deliveries in the next read, and whether the read is done."""
    out, done = asyncio.run(stream_reader._next(end))  # pyright: ignore[reportPrivateUsage]
    return [(seq, m.subject, m.payload) for seq, m in zip(out.seqs, out.messages, strict=True)], done


def test_control_frames_are_answered_counted_or_raised_and_messages_returned() -> None:
    wire = FakeWire([b"MSG a.b 3 _INBOX.x 5\r\nhel", b"lo\r\nPING\r\nPONG\r\n+OK\r\nINFO {}\r\n"])
    assert asyncio.run(wire.read_messages()) == []
    [message] = asyncio.run(wire.read_messages())
    assert (message.subject, message.sid, message.reply, message.payload) == (b"a.b", b"3", b"_INBOX.x", b"hello")
    assert wire.sent == b"PONG\r\n" and wire._pongs == 1  # pyright: ignore[reportPrivateUsage]
    wire = FakeWire([b"MSG a 3 1\r\nx\r\n-ERR 'Authorization Violation'\r\n"])
    with pytest.raises(WireError, match="Authorization Violation"):
        asyncio.run(wire.read_messages())


def test_a_request_keeps_other_messages_and_names_missing_responders() -> None:
    others: list[Msg] = []
    wire = FakeWire([b"MSG d 9 2\r\nhi\r\nMSG _INBOX.r 1 5\r\nreply\r\n"])
    assert asyncio.run(request(wire, "svc", b"q", others=others)) == b"reply"
    assert [m.payload for m in others] == [b"hi"]
    assert wire.sent.startswith(b"SUB _INBOX.") and wire.sent.endswith(b" 1\r\nq\r\nUNSUB 1\r\n")
    wire = FakeWire([b"HMSG _INBOX.r 1 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"])
    with pytest.raises(WireError, match="no responders on svc"):
        asyncio.run(request(wire, "svc", b"q"))


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
    flow = b"HMSG _INBOX.d 7 $JS.FC.SHOAL_EVENTS.x.1 36 36\r\nNATS/1.0 100 FlowControl Request\r\n\r\n\r\n"
    stream_reader, wire = reader([delivery(1, 1, 0) + flow + delivery(2, 2, 0)])
    out, _ = next_batch(stream_reader)
    assert [seq for seq, _, _ in out] == [1, 2]
    assert b"PUB $JS.FC.SHOAL_EVENTS.x.1 0\r\n" in wire.sent
    beat = b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 5\r\nNats-Last-Stream: 5\r\n\r\n"
    frame = f"HMSG _INBOX.d 7 {len(beat)} {len(beat)}\r\n".encode() + beat + b"\r\n"
    stream_reader, _ = reader([delivery(1, 1, 4) + frame])
    with pytest.raises(ConsumerRestart, match="heartbeat says delivery 5"):
        next_batch(stream_reader)


def test_v2_reply_layout_is_read_and_other_subscriptions_are_ignored() -> None:
    other = delivery(99, 1, 0, sid=8)
    stream_reader, _ = reader([delivery(1, 1, 2, v2=True) + other + delivery(2, 2, 1) + delivery(3, 3, 0, v2=True)])
    out, _ = next_batch(stream_reader)
    assert [seq for seq, _, _ in out] == [1, 2, 3]


@pytest.mark.parametrize(
    "odd",
    [
        b"HMSG _INBOX.d 7 33 33\r\nNATS/1.0 409 Consumer Deleted\r\n\r\n\r\n",  # a status other than 100
        b"MSG _INBOX.d 7 $JS.ACK.S.c.1.x.1.0.0 1\r\nx\r\n",  # a reply that is not numbered
        b"MSG _INBOX.d 7 _INBOX.elsewhere 1\r\nx\r\n",  # neither a delivery nor a status
    ],
)
def test_an_odd_message_on_the_deliver_subject_restarts_the_consumer(odd: bytes) -> None:
    stream_reader, _ = reader([delivery(1, 1, 5) + odd])
    with pytest.raises(ConsumerRestart):
        next_batch(stream_reader)


def test_server_urls() -> None:
    assert split_servers("nats://a:1, nats://u:p@b:2,c") == [
        ("a", 1, {}),
        ("b", 2, {"user": "u", "pass": "p"}),
        ("c", 4222, {}),
    ]
    assert split_servers("nats://tok@h:5") == [("h", 5, {"auth_token": "tok"})]
    with pytest.raises(ValueError, match="scheme"):
        split_servers("http://h:1")


class CancelledAsItConnects(Wire):
    """A wire whose handshake completes in the same instant its opener is cancelled: the race
    that made a stopped master's heartbeat follow() read on forever (Python 3.11's wait_for
    returned the wire and dropped the cancel)."""

    opener: asyncio.Task[Wire] | None = None

    @classmethod
    async def _handshake(cls, *args: object, **kwargs: object) -> Wire:  # pyright: ignore[reportIncompatibleMethodOverride]
        assert cls.opener is not None
        cls.opener.cancel()
        return FakeWire([])


async def test_a_cancel_that_arrives_as_the_handshake_completes_is_not_lost() -> None:
    opening = asyncio.create_task(CancelledAsItConnects.open("nats://127.0.0.1:1"))
    CancelledAsItConnects.opener = opening
    with pytest.raises(asyncio.CancelledError):
        await opening
