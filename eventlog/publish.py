"""Pipelined, acknowledged JetStream publishing over a `Wire` (the engine of `append_many`).

Every message carries `Nats-Msg-Id` (the event_id), so resending an unacknowledged one after a
lost connection stores it once; the acknowledgement of a duplicate carries the original's seq.
Events are encoded as they are sent (not all up front), so the client encodes while the server
stores; each encoding is kept for a resend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec

from eventlog.wire import Wire
from events.catalogue import AnyEvent
from events.codec import encode
from events.subjects import subject_for

PUBLISH_WINDOW = 4096  # appends in flight at once
ACK_TIMEOUT_S = 5.0


class LogError(RuntimeError):
    """The log refused an operation (stream missing, NATS unreachable past the retry time)."""


class LogUnreachable(LogError):
    """NATS did not acknowledge within the retry time: the operation may succeed if retried (with
    the same event ids, so nothing is stored twice), unlike a refusal."""


class NotYetDecided(LogError):
    """The server answered without deciding about the message (`NOT_YET_DECIDED`): the same
    message, resent with the same id, gets the real answer (its seq, or a duplicate's)."""


# JetStream answers that are no decision about a message. 10158: an earlier send of the same
# message id is still being proposed in the stream's raft group (a resend after a lost quorum or a
# leader change, while the first try may yet commit); 10167: the stream's ingest queue is full.
# Taken as refusals, they failed tasks whose events were about to be stored (issue 46's nemesis).
NOT_YET_DECIDED = frozenset({10158, 10167})


# What an unacknowledged append can mean, for the message the API's 503 carries: a server whose
# store is out of disk space acknowledges nothing, with no error either (nats-server 2.15).
UNACKED = " (NATS down or unreachable, or its JetStream store out of disk space: its log says so)"


class _PubAck(msgspec.Struct, frozen=True):
    seq: int = 0
    duplicate: bool = False
    error: dict[str, object] | None = None


_pub_ack = msgspec.json.Decoder(_PubAck)


def decode_ack(payload: bytes) -> int:
    """The seq of a JetStream publish acknowledgement (a duplicate's: the original's); `LogError`
    when the server refused the message, `NotYetDecided` when it has not decided yet."""
    ack = _pub_ack.decode(payload)
    if ack.error is not None and ack.error.get("err_code") in NOT_YET_DECIDED:
        raise NotYetDecided(f"append not yet decided: {ack.error.get('description', ack.error)}")
    if ack.error is not None:
        raise LogError(f"append refused: {ack.error.get('description', ack.error)}")
    return ack.seq


def msg_id_headers(event_id: str) -> bytes:
    return b"NATS/1.0\r\nNats-Msg-Id: " + event_id.encode() + b"\r\n\r\n"


class Outbox:
    """The events of one `append_many`, their encodings (made once, on first send) and their seqs."""

    def __init__(self, events: Sequence[AnyEvent], subjects: Sequence[str | None] | None = None) -> None:
        """`subjects`: where given (not None), the subject each event is stored on instead of its own
        (`subject_for`): an import keeps the subject the server checked when the event was first
        published, so a fold holds it to the same publisher (a misrouted event stays misrouted)."""
        self.events = events
        self.subjects = subjects
        self.seqs = [0] * len(events)
        self._encoded: list[tuple[bytes, bytes, bytes] | None] = [None] * len(events)

    def unacknowledged(self) -> list[int]:
        return [i for i, seq in enumerate(self.seqs) if seq == 0]

    def frame(self, index: int, reply_prefix: bytes) -> bytes:
        encoded = self._encoded[index]
        if encoded is None:
            event = self.events[index]
            kept = self.subjects[index] if self.subjects is not None else None
            subject = kept if kept is not None else subject_for(event)
            encoded = (subject.encode(), msg_id_headers(event.env.event_id), encode(event))
            self._encoded[index] = encoded
        subject, headers, payload = encoded
        size = len(headers)
        return b"HPUB %s %s%d %d %d\r\n%s%s\r\n" % (
            subject,
            reply_prefix,
            index,
            size,
            size + len(payload),
            headers,
            payload,
        )


async def pipeline(wire: Wire, outbox: Outbox, todo: list[int]) -> None:
    """Publish outbox[todo] with at most PUBLISH_WINDOW unacknowledged; fill outbox.seqs from the acks."""
    inbox = wire.new_inbox()
    sid = wire.subscribe(inbox + ".*")
    prefix = inbox.encode() + b"."
    acks = _AckReader(wire, sid, len(prefix), outbox.seqs)
    sent = 0
    while acks.count < len(todo):
        batch = [outbox.frame(todo[i], prefix) for i in range(sent, min(len(todo), acks.count + PUBLISH_WINDOW))]
        sent += len(batch)
        wire.send_raw(b"".join(batch))
        await wire.flush()
        async with asyncio.timeout(ACK_TIMEOUT_S):
            await acks.read()
    wire.unsubscribe(sid)


class _AckReader:
    """Reads acknowledgements (`MSG <inbox>.<index> <sid> <len>`) from the wire into `seqs`."""

    def __init__(self, wire: Wire, sid: bytes, cut: int, seqs: list[int]) -> None:
        self._wire = wire
        self._sid = sid
        self._cut = cut
        self._seqs = seqs
        self.count = 0

    async def read(self) -> None:
        for message in await self._wire.read_messages():
            if message.sid != self._sid:
                continue
            if message.headers and message.status == 503:  # acks have no headers: skip the parse
                raise LogError("no stream accepts the log's subjects: run ensure_streams() (or start shoal's NATS)")
            self._ack(int(message.subject[self._cut :]), message.payload)

    def _ack(self, index: int, payload: bytes) -> None:
        seq = decode_ack(payload)
        if self._seqs[index] == 0:
            self._seqs[index] = seq
            self.count += 1
