"""Single appends for one publisher that appends all the time (the runner's bridge, a chunk per token).

`EventLog.append` goes through nats-py: a request future, an inbox mux, a flusher task and a
reader task per acknowledgement, a `PubAck` parsed with the json module. For one event per
generated token that is ~130 µs of the runner's CPU (and GIL) per token, taken from the model's
forward on a small machine. An `Appender` keeps a connection of its own (`eventlog.wire`) with one
standing subscription for its acknowledgements: an append is one HPUB and one read, about half the
client's CPU and less of the server's. With many streams, several events wait at once:
`append_pipelined` sends them in one write and reads their acknowledgements together, one wake-up
of the loop for all of them instead of one round trip each.

Semantics are `EventLog.append`'s: the event carries `Nats-Msg-Id` (a resend of a stored event
returns the original's seq); not acknowledged for `retry_seconds` (connection gone, server paused,
JetStream not answering yet) is `LogUnreachable`, call again to keep trying; refused by the server
is `LogError`. Each try has a reply subject of its own, so a late acknowledgement of an earlier
try is never taken for this one. One owner at a time (it reads its own connection).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from eventlog.endpoint import NatsEndpoint
from eventlog.publish import UNACKED, LogError, LogUnreachable, NotYetDecided, decode_ack, msg_id_headers
from eventlog.tls import TlsRefused
from eventlog.wire import Wire, WireClosed, WireError
from events.catalogue import LogEvent
from events.codec import encode
from events.subjects import subject_for

ACK_TIMEOUT_S = 2.0  # as `EventLog.append`'s publish timeout
RETRY_PAUSE_S = 0.1
NO_RESPONDERS = 503  # JetStream not (yet) listening on the subject: retried, as nats-py's NoRespondersError
REFUSALS = ("Maximum Payload Violation", "Permissions Violation")  # -ERRs that no resend can change


class _NotAcknowledged(Exception):
    """This try got no acknowledgement (the next one resends with the same event id)."""


class Appender:
    def __init__(self, endpoint: NatsEndpoint, retry_seconds: float, name: str = "shoal-append") -> None:
        self._endpoint = endpoint
        self._retry_seconds = retry_seconds
        self._name = name
        self._wire: Wire | None = None
        self._sid = b""
        self._inbox = b""
        self._tries = 0  # names each try's reply subject

    async def append(self, event: LogEvent) -> int:
        """Store one event; its seq (see the module docstring for the errors)."""
        subject = subject_for(event)
        headers, payload = msg_id_headers(event.env.event_id), encode(event)
        deadline = time.monotonic() + self._retry_seconds
        retrying = False
        while True:
            try:
                return await self._try(subject.encode(), headers, payload)
            except TlsRefused as exc:
                raise LogError(str(exc)) from exc
            except WireError as exc:
                self.close()
                if any(refusal in str(exc) for refusal in REFUSALS):
                    raise LogError(f"append to {subject} refused: {exc}") from exc
                failure: Exception = exc  # e.g. a stale connection the server closed while we were idle
            except (_NotAcknowledged, NotYetDecided, WireClosed, OSError, TimeoutError) as exc:
                self.close()  # a fresh connection for the next try: this one may be wedged
                failure = exc
            if time.monotonic() > deadline:
                failed = f"append to {subject} not acknowledged for {self._retry_seconds}s{UNACKED}: {failure}"
                raise LogUnreachable(failed) from failure
            await asyncio.sleep(RETRY_PAUSE_S if retrying else 0)  # a closed idle connection: reconnect at once
            retrying = True

    async def append_pipelined(self, events: Sequence[LogEvent]) -> list[int | None]:
        """Send every event at once (one write, one flush), then read their acknowledgements: each
        event's seq, or None for each one not acknowledged. One try, no resend: on any failure
        (connection lost, a refusal, no answer in time) the connection is closed and what was not
        acknowledged is None, for the caller to resend one by one with `append` (same ids, so what
        the server did store is stored once). On one connection the server stores them in order."""
        if not events:
            return []
        seqs: list[int | None] = [None] * len(events)
        try:
            wire = await self._connected()
            replies: dict[bytes, int] = {}
            frames: list[bytes] = []
            for index, event in enumerate(events):
                self._tries += 1
                reply = b"%s.%d" % (self._inbox, self._tries)
                replies[reply] = index
                frames.append(
                    _frame(subject_for(event).encode(), reply, msg_id_headers(event.env.event_id), encode(event))
                )
            wire.send_raw(b"".join(frames))
            await wire.flush()
            waiting = len(events)
            async with asyncio.timeout(ACK_TIMEOUT_S):
                while waiting:
                    for message in await wire.read_messages():
                        index = replies.pop(message.subject, None) if message.sid == self._sid else None
                        if index is None:
                            continue  # an earlier try's late acknowledgement
                        waiting -= 1
                        if not (message.headers and message.status == NO_RESPONDERS):
                            seqs[index] = _seq_or_none(message.payload)
        except (TlsRefused, WireError, WireClosed, OSError, TimeoutError):
            self.close()  # the rest goes one by one, where each failure is told apart
        return seqs

    def close(self) -> None:
        if self._wire is not None:
            self._wire.close()
            self._wire = None

    async def _try(self, subject: bytes, headers: bytes, payload: bytes) -> int:
        wire = await self._connected()
        self._tries += 1
        reply = b"%s.%d" % (self._inbox, self._tries)
        wire.send_raw(_frame(subject, reply, headers, payload))
        await wire.flush()
        async with asyncio.timeout(ACK_TIMEOUT_S):
            while True:
                for message in await wire.read_messages():
                    if message.sid != self._sid or message.subject != reply:
                        continue  # an earlier try's late acknowledgement
                    if message.headers and message.status == NO_RESPONDERS:
                        raise _NotAcknowledged(f"no responders on {subject.decode()}")
                    return decode_ack(message.payload)

    async def _connected(self) -> Wire:
        if self._wire is None:
            endpoint = self._endpoint
            wire = await Wire.open(
                endpoint.url,
                tls=endpoint.tls_context(),
                identity=endpoint.identity,
                timeout=ACK_TIMEOUT_S,
                name=self._name,
            )
            self._inbox = wire.new_inbox().encode()
            self._sid = wire.subscribe(self._inbox.decode() + ".*")
            self._wire = wire
        return self._wire


def _frame(subject: bytes, reply: bytes, headers: bytes, payload: bytes) -> bytes:
    size = len(headers)
    return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject, reply, size, size + len(payload), headers, payload)


def _seq_or_none(payload: bytes) -> int | None:
    """A refused event's is None: its resend alone reports the refusal."""
    try:
        return decode_ack(payload)
    except LogError:
        return None
