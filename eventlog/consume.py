"""Reading a JetStream stream in order over a `Wire`: the engine behind replay() and follow().

Each read creates an ephemeral push consumer (no acks, flow control, idle heartbeats) that starts
at the next sequence wanted, and checks the consumer's delivery sequence on every message
(as nats.go's ordered consumer does). Any doubt — a delivery gap, a heartbeat that reports a
message we did not see, silence longer than three heartbeats, a lost connection — drops the
consumer and starts a new one at `last seen + 1`, so a reader never skips nor repeats a sequence,
across server restarts included.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import msgspec

from eventlog.wire import Wire, WireError, WireMessage, request

IDLE_HEARTBEAT_S = 1.0


class ConsumerRestart(Exception):
    """The current consumer cannot be trusted any more; start a new one after the last seq."""


class StreamNotFound(WireError):
    """The stream does not exist (JetStream error 10059): retrying a bounded read cannot help."""


def _api_failure(what: str, error: ApiError | None) -> WireError:
    description = error.description if error is not None else "no answer"
    if error is not None and error.err_code == 10059:
        return StreamNotFound(f"{what}: {description} (create it with ensure_streams / `shoal nats`)")
    return WireError(f"{what}: {description}")


class ApiError(msgspec.Struct, frozen=True):
    code: int = 0
    err_code: int = 0
    description: str = ""


class ConsumerCreated(msgspec.Struct, frozen=True):
    num_pending: int = 0
    error: ApiError | None = None


class StreamState(msgspec.Struct, frozen=True):
    messages: int = 0
    first_seq: int = 0
    last_seq: int = 0


class StreamInfoReply(msgspec.Struct, frozen=True):
    state: StreamState | None = None
    error: ApiError | None = None


_created = msgspec.json.Decoder(ConsumerCreated)
_stream_info = msgspec.json.Decoder(StreamInfoReply)
_json = msgspec.json.Encoder()


class Position(msgspec.Struct, kw_only=True):
    """Where a read starts: `seq` (next sequence wanted) wins over `time` once anything was seen."""

    seq: int | None = None
    time: datetime | None = None


def consumer_config(name: str, deliver: str, position: Position, subjects: list[str]) -> dict[str, object]:
    config: dict[str, object] = {
        "name": name,
        "deliver_subject": deliver,
        "ack_policy": "none",
        "replay_policy": "instant",
        "flow_control": True,
        "idle_heartbeat": int(IDLE_HEARTBEAT_S * 1e9),
        "inactive_threshold": int(30e9),
        "mem_storage": True,
        "num_replicas": 1,
    }
    if position.seq is not None:
        config |= {"deliver_policy": "by_start_sequence", "opt_start_seq": max(1, position.seq)}
    elif position.time is not None:
        stamp = position.time.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        config |= {"deliver_policy": "by_start_time", "opt_start_time": stamp}
    else:
        config["deliver_policy"] = "all"
    if len(subjects) == 1:
        config["filter_subject"] = subjects[0]
    elif subjects:
        config["filter_subjects"] = subjects
    return config


def _header(headers: bytes, name: bytes) -> bytes | None:
    for line in headers.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name.lower():
            return value.strip()
    return None


async def stream_last_seq(wire: Wire, stream: str) -> int:
    reply = _stream_info.decode(await request(wire, f"$JS.API.STREAM.INFO.{stream}", b""))
    if reply.error is not None or reply.state is None:
        raise _api_failure(f"stream info for {stream} failed", reply.error)
    return reply.state.last_seq


class StreamReader:
    """One consumer on one wire; `batches()` yields lists of (seq, subject, payload).

    `live=False` stops at the end of the stream as it was when the read began.
    """

    def __init__(self, wire: Wire, stream: str, subjects: list[str], *, live: bool) -> None:
        self._wire = wire
        self._stream = stream
        self._subjects = subjects
        self._live = live
        self._name = ""
        self._deliver = ""
        self._sid = 0
        self._early: list[WireMessage] = []  # deliveries that raced the create reply
        self._expected = 1

    async def _create(self, position: Position) -> int:
        """Create the consumer; returns its pending count. The deliver SUB is live before."""
        self._name = f"shoal_{secrets.token_hex(8)}"
        self._deliver = self._wire.new_inbox()
        self._sid = self._wire.subscribe(self._deliver)
        config = consumer_config(self._name, self._deliver, position, self._subjects)
        body = _json.encode({"stream_name": self._stream, "config": config, "action": "create"})
        subject = f"$JS.API.CONSUMER.CREATE.{self._stream}.{self._name}"
        raw = await request(self._wire, subject, body, others=self._early)
        created = _created.decode(raw)
        if created.error is not None:
            raise _api_failure(f"cannot read stream {self._stream}", created.error)
        return created.num_pending

    async def batches(self, position: Position) -> AsyncIterator[list[tuple[int, bytes, bytes]]]:
        end = 0 if self._live else await stream_last_seq(self._wire, self._stream)
        if not self._live and (end == 0 or (position.seq is not None and position.seq > end)):
            return
        pending = await self._create(position)
        if not self._live and pending == 0:
            return
        self._expected = 1  # next delivery sequence
        early, self._early = self._early, []
        out, done = self._select(early, end)
        if out or self._live:
            yield out
        while not done:
            out, done = await self._next(end)
            if out or self._live:
                yield out  # live: empty batches too, so the caller can notice a close

    async def _next(self, end: int) -> tuple[list[tuple[int, bytes, bytes]], bool]:
        """The deliveries in the next socket read.

        The common frame, a JetStream delivery with a v1 reply subject, is parsed inline here (two
        splits, three ints: this loop is the replay's hot path); anything else goes through the
        wire's generic parser and `_select`. Delivery sequences are checked per batch: the server
        sends them increasing, so first == expected and last == first + count - 1 means no gap.
        """
        buf = await self._read()
        out: list[tuple[int, bytes, bytes]] = []
        pos, size, sid, live = 0, len(buf), str(self._sid).encode(), self._live
        first_dseq = last_dseq = b""
        mark = 0  # index in `out` where the inline deliveries since the last check begin
        done = False
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            if buf.startswith(b"HMSG ", pos):
                parts = buf[pos + 5 : eol].split(b" ")
                if len(parts) == 5 and parts[1] == sid and parts[2].count(b".") == 8:
                    subject, _, reply, hlen, tlen = parts
                    stop = eol + 2 + int(tlen)
                    if stop + 2 > size:
                        break  # incomplete: the rest comes with the next read
                    _, seq_text, dseq, _, pending = reply.rsplit(b".", 4)
                    seq = int(seq_text)
                    out.append((seq, subject, buf[eol + 2 + int(hlen) : stop]))
                    first_dseq = first_dseq or dseq
                    last_dseq = dseq
                    pos = stop + 2
                    if not live and (seq >= end or pending == b"0"):
                        done = True
                        break
                    continue
            self._check(len(out) - mark, first_dseq, last_dseq)
            first_dseq, last_dseq, mark = b"", b"", len(out)
            message, after = self._wire.parse_frame(buf, pos)
            if after < 0:
                break
            pos = after
            if message is not None:
                more, done = self._select([message], end)
                out += more
                mark = len(out)
                if done:
                    break
        self._check(len(out) - mark, first_dseq, last_dseq)
        self._wire.unread(buf[pos:])
        if not done:
            await self._wire.flush()  # flow-control replies now: the server refills while we fold
        return out, done

    async def _read(self) -> bytes:
        try:
            async with asyncio.timeout(3 * IDLE_HEARTBEAT_S):
                return await self._wire.read_data()
        except TimeoutError as exc:
            raise ConsumerRestart("no message nor heartbeat for 3 heartbeat intervals") from exc

    def _check(self, count: int, first: bytes, last: bytes) -> None:
        """Account for `count` deliveries parsed inline, numbered `first`..`last`."""
        if not count:
            return
        start, stop = int(first), int(last)
        if start != self._expected or stop != start + count - 1:
            raise ConsumerRestart(f"delivery gap: expected deliveries {self._expected}.., got {start}..{stop}")
        self._expected = stop + 1

    def _select(self, messages: list[WireMessage], end: int) -> tuple[list[tuple[int, bytes, bytes]], bool]:
        """The stream messages of this consumer in `messages`, and whether a bounded read is done."""
        out: list[tuple[int, bytes, bytes]] = []
        sid, expected, live = self._sid, self._expected, self._live
        for msid, subject, reply, headers, payload in messages:
            if msid != sid:
                continue
            if headers.startswith(b"NATS/1.0 100"):
                self._control(reply, headers, expected)
                continue
            tokens = reply.split(b".")
            if len(tokens) != 9:  # v2 layout: $JS.ACK.<domain>.<account>.<stream>...<pending>.<token>
                tokens = tokens[2:-1]
            if len(tokens) != 9 or int(tokens[6]) != expected:
                self._expected = expected
                raise ConsumerRestart(f"delivery gap or odd reply: expected delivery {expected}, got {reply[:120]!r}")
            expected += 1
            seq = int(tokens[5])
            out.append((seq, subject, payload))
            if not live and (seq >= end or tokens[8] == b"0"):
                self._expected = expected
                return out, True
        self._expected = expected
        return out, False

    def _control(self, reply: bytes, headers: bytes, expected: int) -> None:
        if reply:  # flow control request: answered with the next read, after what came before
            self._wire.publish(reply, b"")
            return
        stalled = _header(headers, b"Nats-Consumer-Stalled")
        if stalled:
            self._wire.publish(stalled, b"")
        last = _header(headers, b"Nats-Last-Consumer")
        if last is not None and int(last) >= expected:
            raise ConsumerRestart(f"heartbeat says delivery {int(last)} was sent; we saw {expected - 1}")

    def drop(self) -> None:
        """Delete the consumer (best effort; it also expires on its own after 30 s idle)."""
        if self._name:
            subject = f"$JS.API.CONSUMER.DELETE.{self._stream}.{self._name}"
            self._wire.publish(subject.encode(), b"")
            self._name = ""
