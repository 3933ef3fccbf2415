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

from eventlog.frames import Msg
from eventlog.wire import Wire, WireError, request

IDLE_HEARTBEAT_S = 1.0
CREATE_TIMEOUT_S = 5.0  # a consumer create this long unanswered: the wire is dropped and read again
CREATE_HEDGE_S = 1.0  # a create unanswered this long is joined by another beside it (`_create`)


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
    """Where a read starts: `seq` (next sequence wanted) wins over `time` and `last` once anything
    was seen; `last`: the newest message on the read's subjects only."""

    seq: int | None = None
    time: datetime | None = None
    last: bool = False


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
    elif position.last:
        config["deliver_policy"] = "last"
    else:
        config["deliver_policy"] = "all"
    if len(subjects) == 1:
        config["filter_subject"] = subjects[0]
    elif subjects:
        config["filter_subjects"] = subjects
    return config


def create_subject(stream: str, name: str, subjects: list[str]) -> str:
    """The JetStream request creating consumer `name`. With one filter subject it names the filter
    (`...CREATE.<stream>.<name>.<filter>`, which the server checks against the config's), so the
    bus can allow an identity only consumers filtered to its subjects (`nats_permissions`:
    workers and runners); several filters can only go by the unfiltered request."""
    base = f"$JS.API.CONSUMER.CREATE.{stream}.{name}"
    return f"{base}.{subjects[0]}" if len(subjects) == 1 else base


async def stream_last_seq(wire: Wire, stream: str) -> int:
    reply = _stream_info.decode(await request(wire, f"$JS.API.STREAM.INFO.{stream}", b""))
    if reply.error is not None or reply.state is None:
        raise _api_failure(f"stream info for {stream} failed", reply.error)
    return reply.state.last_seq


class _CreateTry(msgspec.Struct, frozen=True):
    """One consumer create sent: the consumer's name, and the sids of its deliveries and its answer."""

    name: str
    deliver_sid: bytes
    reply_sid: bytes


class Deliveries(msgspec.Struct):
    """Stream messages in order, as one socket read brought them: `seqs[i]` is the stream
    sequence of `messages[i]`. Two parallel lists rather than a pair per message: the replay's
    hot path builds and walks them (`zip`) at the cost of two appends per message."""

    seqs: list[int] = msgspec.field(default_factory=list[int])
    messages: list[Msg] = msgspec.field(default_factory=list[Msg])


class StreamReader:
    """One consumer on one wire; `batches()` yields `Deliveries`.

    `live=False` stops at the end of the stream as it was when the read began.
    """

    def __init__(self, wire: Wire, stream: str, subjects: list[str], *, live: bool) -> None:
        self._wire = wire
        self._stream = stream
        self._subjects = subjects
        self._live = live
        self._name = ""
        self._sid = b""
        self._early: list[Msg] = []  # deliveries that raced the create reply
        self._expected = 1

    async def _create(self, position: Position) -> int:
        """Create the consumer; returns its pending count. Each try's deliver SUB is live before.

        A try not answered within `CREATE_HEDGE_S` is joined by another, beside it, under a new
        name: an R1 consumer is placed on a server chosen among the stream's replicas, and one
        that died a moment ago still counts as alive to the JetStream leader for a while, so a
        create can vanish with it. One try at a time cost a whole `CREATE_TIMEOUT_S` per such
        placement (two in a row kept a runner from reading its assignments for 10 s after one NATS
        server of three was killed). The first answer wins; the other tries are deleted."""
        tries: dict[bytes, _CreateTry] = {}  # by the sid of the try's reply inbox
        try:
            created = await self._hedged_create(position, tries)
        finally:
            for attempt in tries.values():
                self._wire.unsubscribe(attempt.reply_sid)
                if attempt.name != self._name:
                    self._wire.unsubscribe(attempt.deliver_sid)
                    self._delete(attempt.name)
        if created.error is not None:
            raise _api_failure(f"cannot read stream {self._stream}", created.error)
        return created.num_pending

    async def _hedged_create(self, position: Position, tries: dict[bytes, _CreateTry]) -> ConsumerCreated:
        """Send tries into `tries`, one more every `CREATE_HEDGE_S`, until one is answered: that
        one becomes this reader's consumer."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + CREATE_TIMEOUT_S
        while loop.time() < give_up:
            attempt = self._ask_create(position)
            tries[attempt.reply_sid] = attempt
            await self._wire.flush()
            answer = await self._first_answer(tries, min(loop.time() + CREATE_HEDGE_S, give_up))
            if answer is not None:
                won, created = answer
                self._name, self._sid = won.name, won.deliver_sid
                return created
        raise TimeoutError(f"no answer to {len(tries)} consumer creates on {self._stream} in {CREATE_TIMEOUT_S:g}s")

    def _ask_create(self, position: Position) -> _CreateTry:
        name = f"shoal_{secrets.token_hex(8)}"
        deliver = self._wire.new_inbox()
        deliver_sid = self._wire.subscribe(deliver)
        config = consumer_config(name, deliver, position, self._subjects)
        body = _json.encode({"stream_name": self._stream, "config": config, "action": "create"})
        inbox = self._wire.new_inbox()
        reply_sid = self._wire.subscribe(inbox)
        subject = create_subject(self._stream, name, self._subjects)
        self._wire.publish(subject.encode(), body, inbox.encode())
        return _CreateTry(name=name, deliver_sid=deliver_sid, reply_sid=reply_sid)

    async def _first_answer(
        self, tries: dict[bytes, _CreateTry], until: float
    ) -> tuple[_CreateTry, ConsumerCreated] | None:
        """The first try answered before the event loop's time `until`, with its answer; deliveries that
        race the answers are kept (`_early`: a delivery for a try that loses is dropped later,
        by its sid)."""
        while (left := until - asyncio.get_running_loop().time()) > 0:
            try:
                async with asyncio.timeout(left):
                    messages = await self._wire.read_messages()
            except TimeoutError:
                break
            for index, message in enumerate(messages):
                attempt = tries.get(message.sid)
                if attempt is None:
                    continue
                if message.status == 503:
                    raise WireError(f"no responders on the consumer create of {self._stream} (is JetStream enabled?)")
                self._early += [m for m in messages[:index] + messages[index + 1 :] if m.sid not in tries]
                return attempt, _created.decode(message.payload)
            self._early += messages
        return None

    def _delete(self, name: str) -> None:
        """Delete consumer `name` (best effort, unanswered: it also expires on its own after 30 s
        with no one reading)."""
        self._wire.publish(f"$JS.API.CONSUMER.DELETE.{self._stream}.{name}".encode(), b"")

    async def batches(self, position: Position) -> AsyncIterator[Deliveries]:
        end = 0 if self._live else await stream_last_seq(self._wire, self._stream)
        if not self._live and (end == 0 or (position.seq is not None and position.seq > end)):
            return
        pending = await self._create(position)
        if not self._live and pending == 0:
            return
        self._expected = 1  # next delivery sequence
        early, self._early = self._early, []
        out, done = self._select(early, end)
        if out.seqs or self._live:
            yield out
        while not done:
            out, done = await self._next(end)
            if out.seqs or self._live:
                yield out  # live: empty batches too, so the caller can notice a close

    async def _next(self, end: int) -> tuple[Deliveries, bool]:
        """The deliveries in the next socket read, and whether a bounded read is done."""
        out, done = self._select(await self._read(), end)
        if not done:
            await self._wire.flush()  # flow-control replies now: the server refills while we fold
        return out, done

    async def _read(self) -> list[Msg]:
        try:
            async with asyncio.timeout(3 * IDLE_HEARTBEAT_S):
                return await self._wire.read_messages()
        except TimeoutError as exc:
            raise ConsumerRestart("no message nor heartbeat for 3 heartbeat intervals") from exc

    def _select(self, messages: list[Msg], end: int) -> tuple[Deliveries, bool]:
        """The stream messages of this consumer in `messages`, and whether a bounded read is done.

        This loop is the replay's hot path. A delivery's reply subject carries its stream and
        delivery sequences: `$JS.ACK.<stream>.<consumer>.<delivered>.<seq>.<dseq>.<time>.<pending>`
        (v1), or the v2 layout with `<domain>.<account>.` before the stream and a token after.
        Delivery sequences are checked per run of deliveries (`_account`), not one by one.
        """
        out = Deliveries()
        seqs, delivered = out.seqs, out.messages
        sid, live = self._sid, self._live
        first = last = b""  # the delivery sequences of seqs[checked:], not yet accounted for
        checked = 0
        try:
            for message in messages:
                if message.sid != sid:
                    continue
                tokens = message.reply.split(b".")
                if len(tokens) != 9:
                    if len(tokens) != 12:  # neither layout: a status message (no reply, or $JS.FC...)
                        self._account(len(seqs) - checked, first, last)
                        checked, first = len(seqs), b""
                        self._control(message)
                        continue
                    tokens = tokens[2:-1]  # v2
                last = tokens[6]
                first = first or last
                seq = int(tokens[5])
                seqs.append(seq)
                delivered.append(message)
                if not live and (seq >= end or tokens[8] == b"0"):
                    self._account(len(seqs) - checked, first, last)
                    return out, True
            self._account(len(seqs) - checked, first, last)
        except ValueError as exc:
            raise ConsumerRestart(f"a delivery's reply subject is not numbered: {exc}") from exc
        return out, False

    def _account(self, count: int, first: bytes, last: bytes) -> None:
        """Account for `count` deliveries numbered `first`..`last`. The server numbers deliveries
        increasing, so first == expected and last == first + count - 1 means none is missing."""
        if not count:
            return
        start, stop = int(first), int(last)
        if start != self._expected or stop != start + count - 1:
            raise ConsumerRestart(f"delivery gap: expected deliveries {self._expected}.., got {start}..{stop}")
        self._expected = stop + 1

    def _control(self, message: Msg) -> None:
        """A status message on the deliver subject: flow control or an idle heartbeat."""
        if message.status != 100:
            raise ConsumerRestart(f"unexpected message on the deliver subject: {message.headers[:120]!r}")
        if message.reply:  # flow control request: answered with the next read, after what came before
            self._wire.publish(message.reply, b"")
            return
        stalled = message.header(b"Nats-Consumer-Stalled")
        if stalled:
            self._wire.publish(stalled, b"")
        last = message.header(b"Nats-Last-Consumer")
        if last is not None and int(last) >= self._expected:
            raise ConsumerRestart(f"heartbeat says delivery {int(last)} was sent; we saw {self._expected - 1}")

    def drop(self) -> None:
        """Delete the consumer (best effort; it also expires on its own after 30 s idle)."""
        if self._name:
            self._delete(self._name)
            self._name = ""
