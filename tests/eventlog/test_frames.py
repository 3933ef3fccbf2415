"""The NATS frame parser, fed bytes (sans-IO): every frame kind, any split, typed errors, bounded buffer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog.frames import MAX_CONTROL_LINE, Err, Frame, FrameError, FrameParser, Info, Msg, Ok, Ping, Pong

HEARTBEAT = b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 5\r\nNats-Last-Stream: 9\r\n\r\n"
FLOW = b"NATS/1.0 100 FlowControl Request\r\n\r\n"
NO_MESSAGES = b"NATS/1.0 404 No Messages\r\n\r\n"
STORED = b"NATS/1.0\r\nNats-Msg-Id: ev-1\r\n\r\n"


def wire_bytes(frame: Frame) -> bytes:
    """How the server sends `frame` (the inverse of the parser, for building test streams)."""
    match frame:
        case Msg(subject=subject, sid=sid, reply=reply, headers=headers, payload=payload):
            fields = [subject, sid, *([reply] if reply else [])]
            if headers:
                sizes = b"%d %d" % (len(headers), len(headers) + len(payload))
                return b"HMSG " + b" ".join([*fields, sizes]) + b"\r\n" + headers + payload + b"\r\n"
            return b"MSG " + b" ".join([*fields, b"%d" % len(payload)]) + b"\r\n" + payload + b"\r\n"
        case Ping():
            return b"PING\r\n"
        case Pong():
            return b"PONG\r\n"
        case Ok():
            return b"+OK\r\n"
        case Err(text=text):
            return b"-ERR '" + text.encode() + b"'\r\n"
        case Info(body=body):
            return b"INFO " + body + b"\r\n"


EVERY_KIND: list[Frame] = [
    Info(b'{"server_id":"x","max_payload":1048576}'),
    Msg(b"_INBOX.a.1", b"3", b"", b"", b'{"seq":4}'),  # a publish acknowledgement
    Msg(b"shoal.ev.t", b"7", b"$JS.ACK.SHOAL_EVENTS.c.1.4.4.17.0", STORED, b"payload\r\nwith CRLF"),
    Msg(b"_INBOX.d", b"7", b"", HEARTBEAT, b""),
    Msg(b"_INBOX.d", b"7", b"$JS.FC.SHOAL_EVENTS.x.1", FLOW, b""),
    Msg(b"_INBOX.r", b"2", b"", NO_MESSAGES, b""),
    Msg(b"a", b"1", b"_INBOX.reply", b"", b""),
    Ping(),
    Pong(),
    Ok(),
    Err("Authorization Violation"),
]
STREAM = b"".join(wire_bytes(frame) for frame in EVERY_KIND)


def feed_all(chunks: list[bytes], parser: FrameParser | None = None) -> list[Frame]:
    parser = parser or FrameParser()
    return [frame for chunk in chunks for frame in parser.feed(chunk)]


def test_every_frame_kind_is_parsed_whole() -> None:
    parser = FrameParser()
    assert parser.feed(STREAM) == EVERY_KIND
    assert parser.buffered == 0


def test_a_stream_split_at_every_byte_boundary_gives_the_same_frames() -> None:
    for cut in range(len(STREAM) + 1):
        assert feed_all([STREAM[:cut], STREAM[cut:]]) == EVERY_KIND, cut


def test_a_stream_fed_byte_by_byte_gives_the_same_frames_and_holds_back_only_the_unfinished_frame() -> None:
    parser = FrameParser()
    frames: list[Frame] = []
    for i in range(len(STREAM)):
        frames += parser.feed(STREAM[i : i + 1])
        assert parser.buffered <= max(len(wire_bytes(frame)) for frame in EVERY_KIND)
    assert frames == EVERY_KIND and parser.buffered == 0


def test_status_codes_and_headers_are_read_from_the_header_block() -> None:
    heartbeat, flow, no_messages, stored = (
        Msg(b"s", b"1", b"", headers, b"") for headers in (HEARTBEAT, FLOW, NO_MESSAGES, STORED)
    )
    assert (heartbeat.status, flow.status, no_messages.status, stored.status) == (100, 100, 404, None)
    assert heartbeat.header(b"nats-last-consumer") == b"5" and heartbeat.header(b"Nats-Last-Stream") == b"9"
    assert heartbeat.header(b"Nats-Consumer-Stalled") is None
    assert stored.header(b"Nats-Msg-Id") == b"ev-1"
    assert Msg(b"s", b"1", b"", b"", b"x").status is None
    assert Msg(b"s", b"1", b"", b"NATS/1.0 50\r\n\r\n", b"").status is None  # not three digits


def test_err_lines_carry_the_servers_text() -> None:
    assert FrameParser().feed(b"-ERR 'Maximum Payload Violation'\r\n-ERR\r\n") == [
        Err("Maximum Payload Violation"),
        Err(""),
    ]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"MSG a 1 x\r\n", "bad message line"),
        (b"HMSG a 1 r 2\r\n", "bad message line"),
        (b"MSG a\r\n", "bad message line"),
        (b"MSG a 1 b c 3\r\n", "bad message line"),
        (b"MSG a 1 -1\r\n", "sizes beyond"),
        (b"HMSG a 1 5 3\r\n", "sizes beyond"),
        (b"MSG a 1 2\r\nabcd\r\n", "does not end where its size says"),
        (b"HMSG a 1 3 3\r\nabc\r\r", "does not end where its size says"),
        (b"BOGUS line\r\n", "unknown protocol line"),
        (b"\r\n", "unknown protocol line"),
        (b"msg a 1 1\r\nx\r\n", "unknown protocol line"),
    ],
)
def test_a_malformed_frame_is_a_frame_error(data: bytes, reason: str) -> None:
    with pytest.raises(FrameError, match=reason):
        FrameParser().feed(data)


def test_a_frame_claiming_a_payload_beyond_the_limit_is_refused_before_it_is_buffered() -> None:
    parser = FrameParser(max_payload=1024)
    assert parser.feed(b"MSG a 1 1024\r\n" + b"x" * 1000) == [] and parser.buffered > 1000
    with pytest.raises(FrameError, match="sizes beyond"):
        FrameParser(max_payload=1024).feed(b"MSG a 1 1025\r\n")
    with pytest.raises(FrameError, match="sizes beyond"):
        FrameParser().feed(b"HMSG a 1 10 99999999999\r\n")  # beyond the default 64 MiB ceiling


def test_a_line_longer_than_the_limit_is_refused_rather_than_held() -> None:
    parser = FrameParser()
    parser.feed(b"INFO " + b"x" * (MAX_CONTROL_LINE - 10))
    with pytest.raises(FrameError, match="no end of line"):
        parser.feed(b"x" * 20)
    with pytest.raises(FrameError, match="message line of"):  # complete, but its payload is not
        FrameParser(max_line=16).feed(b"MSG " + b"a" * 40 + b" 1 5\r\nxx")
    long_subject = b"a" * 40  # a long line is fine once its frame is complete
    assert FrameParser(max_line=16).feed(b"MSG " + long_subject + b" 1 2\r\nxx\r\n") == [
        Msg(long_subject, b"1", b"", b"", b"xx")
    ]


@st.composite
def splits(draw: st.DrawFn, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


SIZES = st.one_of(
    st.integers(-2, 40).map(str),
    st.integers(0, 10**9).map(str),
    st.sampled_from(["", "x", "1_0", "+3", " ", "0x10", "٣"]),
)
MESSAGE_LINES = st.builds(
    lambda op, subject, sizes: f"{op} {subject} 1 {' '.join(sizes)}\r\n".encode(),
    st.sampled_from(["MSG", "HMSG"]),
    st.text("ab.", min_size=1, max_size=150),
    st.lists(SIZES, min_size=1, max_size=3),
)


@st.composite
def noisy_streams(draw: st.DrawFn) -> list[bytes]:
    """Frames and message lines claiming any size, random bytes spliced in, split anywhere."""
    pieces = st.one_of(
        st.sampled_from([wire_bytes(frame) for frame in EVERY_KIND]), MESSAGE_LINES, st.binary(max_size=300)
    )
    data = b"".join(draw(st.lists(pieces, max_size=6)))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(max_size=12)) + data[at + draw(st.integers(0, 4)) :]
    return draw(splits(data))


@settings(max_examples=300)
@given(noisy_streams())
def test_any_bytes_in_any_split_give_frames_or_a_frame_error_and_a_bounded_buffer(chunks: list[bytes]) -> None:
    parser = FrameParser(max_payload=16, max_line=16)
    bound = parser.max_line + parser.max_payload + 4
    try:
        for chunk in chunks:
            frames = parser.feed(chunk)
            assert all(isinstance(frame, Msg | Ping | Pong | Ok | Err | Info) for frame in frames)
            assert parser.buffered <= bound
    except FrameError:
        assert parser.buffered <= bound


@given(
    st.lists(st.sampled_from(EVERY_KIND), max_size=8).flatmap(
        lambda frames: st.tuples(st.just(frames), splits(b"".join(wire_bytes(f) for f in frames)))
    )
)
def test_valid_frames_in_any_split_come_back_exactly(case: tuple[list[Frame], list[bytes]]) -> None:
    frames, chunks = case
    assert feed_all(chunks) == frames
