"""Pipelined, acknowledged JetStream publishing over a `Wire` (the engine of `append_many`).

Every message carries `Nats-Msg-Id` (the event_id), so resending an unacknowledged one after a
lost connection stores it once; the acknowledgement of a duplicate carries the original's seq.
"""

from __future__ import annotations

import asyncio

import msgspec

from events.wire import Wire

PUBLISH_WINDOW = 4096  # appends in flight at once


class LogError(RuntimeError):
    """The log refused an operation (stream missing, NATS unreachable past the retry time)."""


class _PubAck(msgspec.Struct, frozen=True):
    seq: int = 0
    duplicate: bool = False
    error: dict[str, object] | None = None


_pub_ack = msgspec.json.Decoder(_PubAck)


def msg_id_headers(event_id: str) -> bytes:
    return b"NATS/1.0\r\nNats-Msg-Id: " + event_id.encode() + b"\r\n\r\n"


async def pipeline(wire: Wire, frames: list[tuple[bytes, bytes, bytes]], todo: list[int], seqs: list[int]) -> None:
    """Publish frames[todo] with at most PUBLISH_WINDOW unacknowledged; fill seqs from the acks."""
    inbox = wire.new_inbox()
    sid = wire.subscribe(inbox + ".*")
    prefix = inbox.encode() + b"."
    cut = len(prefix)
    sent = acked = 0
    while acked < len(todo):
        while sent < len(todo) and sent - acked < PUBLISH_WINDOW:
            index = todo[sent]
            subject, payload, headers = frames[index]
            wire.publish(subject, payload, prefix + str(index).encode(), headers)
            sent += 1
        await wire.flush()
        async with asyncio.timeout(5.0):
            messages = await wire.read_batch()
        for msid, subject, _reply, headers, payload in messages:
            if msid != sid:
                continue
            if headers.startswith(b"NATS/1.0 503"):
                raise LogError("no stream accepts the log's subjects: run ensure_streams() (or start shoal's NATS)")
            ack = _pub_ack.decode(payload)
            if ack.error is not None:
                raise LogError(f"append refused: {ack.error.get('description', ack.error)}")
            index = int(subject[cut:])
            if seqs[index] == 0:
                seqs[index] = ack.seq
                acked += 1
    wire.unsubscribe(sid)
