"""The JetStream event log (docs/ARCHITECTURE.md §3): append, replay, follow.

    log = await EventLog.connect("nats://127.0.0.1:4222")   # creates/updates both streams
    seq = await log.append(event)                   # Nats-Msg-Id = event.env.event_id
    seqs = await log.append_many(events)            # pipelined, for bulk
    async for seq, event in log.replay(from_seq=1): ...       # stops at the current end
    async for seq, event in log.follow(from_seq=state.last_seq + 1): ...  # then live, forever
    state = await log.fold(from_snapshot=True)      # rebuild a State: the stored snapshot + the tail
    found = await log.get_last(task_subject(task_id, "created"))   # (seq, event) | None
    await log.close()

Guarantees:
- An event is stored once per `event_id` within the duplicate window: a retried append (same
  id) returns the sequence of the stored original.
- `replay`/`follow` yield every sequence at most once, in order, with no gap other than
  malformed messages, which are logged (subject + seq), counted in `malformed` and skipped;
  `entries()` yields those seqs too (event None). A live folder steps over them with
  `events.fold.apply_live` or `events.fold.Folder.skip_to`, since `apply` insists on
  consecutive seqs.
- `follow` survives NATS restarts: it reconnects and resumes at the last seq seen + 1.
- `fold` holds every event to the subject it was stored on (`events.subjects.route_refusal`), and
  `deliveries` hands each event's subject to a fold of its own (`events.fold.apply_live`).

A replay/follow abandoned early should be closed (`async with contextlib.aclosing(...)`), or
it is closed when garbage collected. Stop a `follow` by cancelling its task or `close()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import datetime
from typing import Literal, overload

import nats.errors
import nats.js.errors
from loguru import logger

from eventlog.client import NatsClient
from eventlog.consume import ConsumerRestart, Deliveries, Position, StreamNotFound, StreamReader
from eventlog.endpoint import NatsEndpoint
from eventlog.provision import delete_log_storage, ensure_log_storage, reset_stream
from eventlog.publish import NOT_YET_DECIDED, UNACKED, LogError, LogUnreachable, NotYetDecided, Outbox, pipeline
from eventlog.snapshots import read_snapshot, write_snapshot
from eventlog.streams import LogSettings, stream_name
from eventlog.tls import TlsRefused
from eventlog.wire import PermissionRefused, Wire, WireClosed, WireError
from events.catalogue import AnyEvent, LogEvent, TelemetryEvent
from events.codec import MalformedEvent, decode_log_event, decode_telemetry_event, encode
from events.fold import Folder
from events.retention import with_finished_kept
from events.state import FINISHED_TASKS_KEPT, State
from events.subjects import is_telemetry_subject, subject_for
from events.vocabulary import StreamKey


class EventLog:
    """One connection to the log. Build with `await EventLog.connect(url, settings)`."""

    def __init__(self, client: NatsClient, endpoint: NatsEndpoint, settings: LogSettings) -> None:
        self.endpoint = endpoint
        self.url = endpoint.url
        self.settings = settings
        self.malformed = 0  # messages skipped because they did not decode
        self._client = client
        self._nc = client.nc
        self._tls = client.tls  # the one context of both clients (nats-py and the wire)
        self._js = client.nc.jetstream()  # pyright: ignore[reportUnknownMemberType]
        self._pub_lock = asyncio.Lock()
        self._pub_wire: Wire | None = None
        self._closed = False

    @classmethod
    async def connect(
        cls,
        endpoint: NatsEndpoint | str,
        settings: LogSettings | None = None,
        *,
        name: str = "shoal",
        ensure: bool = True,
        wait_seconds: float = 5.0,
    ) -> EventLog:
        """Connect, waiting up to `wait_seconds` for the server; ensure the streams if `ensure` and
        `endpoint.identity.manage_streams` (a service identity may not: only the admin manages streams).

        `endpoint`: a NatsEndpoint, or a bare URL (no TLS files: a `tls://` URL then trusts the
        system's CAs). Once connected, the connection reconnects forever (a NATS restart is
        survived); a server that never answers at first, an unusable TLS file or a TLS handshake
        the server refuses is a `LogError` that says what to do.
        """
        endpoint = endpoint if isinstance(endpoint, NatsEndpoint) else NatsEndpoint(url=endpoint)
        client = await NatsClient.open(endpoint, name=name, wait_seconds=wait_seconds)
        log = cls(client, endpoint, settings or LogSettings())
        if ensure and endpoint.identity.manage_streams:
            try:
                await log.ensure_streams()
            except BaseException:  # the connection is no one's: left open it reconnects for ever
                await log.close()  # bounded: at once when the server does not answer
                raise
        return log

    # --- streams ----------------------------------------------------------------------------

    async def ensure_streams(self) -> None:
        """Create or update the streams, the lease bucket and the snapshot store (`provision.py`)."""
        await ensure_log_storage(self._js, self.settings)

    async def delete_streams(self) -> None:
        """Delete everything `ensure_streams()` creates (tests, or before an import)."""
        await delete_log_storage(self._js)

    async def reset_stream(self, stream: StreamKey, *, first_seq: int = 1) -> None:
        """Delete one stream and create it empty, its first message to get `first_seq` (imports)."""
        await reset_stream(self._js, stream, self.settings, first_seq=first_seq)

    async def last_seq(self, stream: StreamKey = "events") -> int:
        """The sequence of the newest message in the stream (0 when it never held one)."""
        info = await self._js.stream_info(stream_name(stream))
        return int(info.state.last_seq)

    async def message_count(self, stream: StreamKey = "events") -> int:
        info = await self._js.stream_info(stream_name(stream))
        return int(info.state.messages)

    async def get_last(self, subject: str) -> tuple[int, AnyEvent] | None:
        """The newest message on `subject` (no wildcards needed), e.g. an instance's InstancePlaced.

        Read by a consumer filtered to `subject`, not by JetStream's message get: a get names its
        subject only in the request's body, which the server cannot check, so workers and runners
        may not make one on the events stream (`services.nats_permissions`), while a filtered
        consumer's create request names its filter where the server checks it."""
        stream: StreamKey = "telemetry" if is_telemetry_subject(subject) else "events"
        newest: tuple[int, AnyEvent] | None = None
        async for seq, event in self.entries(subjects=[subject], stream=stream, last=True):  # one at most
            newest = None if event is None else (seq, event)
        return newest

    async def get(self, seq: int) -> AnyEvent | None:
        """The event stored at `seq` of the events stream (None: deleted, trimmed or malformed): a
        control-plane read, by message get."""
        try:
            raw = await self._js.get_msg(stream_name("events"), seq)  # pyright: ignore[reportUnknownMemberType]
        except nats.js.errors.NotFoundError:
            return None
        try:
            return decode_log_event(raw.data or b"")
        except MalformedEvent as exc:
            self._poison(raw.subject or "", seq, exc)
            return None

    async def is_newest_on_its_subject(self, event: LogEvent) -> bool:
        """Whether `event` (by id) is the newest message on its subject; False when NATS cannot say.
        For a publisher that resends after the duplicate window may have passed: its own last
        event on a subject only it writes (a task's chunks) is stored once this says so."""
        try:
            found = await self.get_last(subject_for(event))
        except (LogError, WireError, TimeoutError) as exc:
            logger.debug("cannot tell whether {} is stored: {}", event.env.event_id, exc)
            return False
        return found is not None and found[1].env.event_id == event.env.event_id

    # --- appending --------------------------------------------------------------------------

    async def append(self, event: LogEvent) -> int:
        """Store one event; its seq. A retry (same event_id) returns the original's seq.

        Unacknowledged for `settings.retry_seconds`: `LogUnreachable` (call again to keep trying);
        refused by the server: `LogError`."""
        subject = subject_for(event)
        headers = {"Nats-Msg-Id": str(event.env.event_id)}
        payload = encode(event)
        deadline = time.monotonic() + self.settings.retry_seconds
        while True:
            try:
                ack = await self._js.publish(subject, payload, timeout=2.0, headers=headers)
                return int(ack.seq)
            except (
                TimeoutError,
                nats.errors.NoRespondersError,
                nats.js.errors.NoStreamResponseError,
                nats.errors.ConnectionReconnectingError,
                nats.errors.OutboundBufferLimitError,
            ) as exc:
                if time.monotonic() > deadline:
                    failed = f"append to {subject} not acknowledged for {self.settings.retry_seconds}s{UNACKED}: {exc}"
                    raise LogUnreachable(failed) from exc
                logger.debug("append to {} not acknowledged ({}); retrying with the same id", subject, exc)
                await asyncio.sleep(0.1)
            except nats.js.errors.APIError as exc:
                if exc.err_code not in NOT_YET_DECIDED:
                    raise LogError(f"append to {subject} refused: {exc}") from exc
                if time.monotonic() > deadline:
                    failed = f"append to {subject} not decided for {self.settings.retry_seconds}s: {exc}"
                    raise LogUnreachable(failed) from exc
                logger.debug("append to {} not yet decided ({}); resending with the same id", subject, exc)
                await asyncio.sleep(0.1)

    async def append_many(self, events: Iterable[AnyEvent], subjects: Sequence[str | None] | None = None) -> list[int]:
        """Store many events in order, pipelined; their seqs. Retries resend only unacknowledged ones.

        Each event goes to the stream of its subject (heartbeats to SHOAL_TELEMETRY); `subjects`, an
        import's, keeps the subjects the events were first stored on (`Outbox`).
        """
        outbox = Outbox(events if isinstance(events, Sequence) else list(events), subjects)
        async with self._pub_lock:
            deadline = time.monotonic() + self.settings.retry_seconds
            while True:
                todo = outbox.unacknowledged()
                if not todo:
                    return outbox.seqs
                try:
                    wire = self._pub_wire or await Wire.open(
                        self.url, tls=self._tls, identity=self.endpoint.identity, name="shoal-append"
                    )
                    self._pub_wire = wire
                    await pipeline(wire, outbox, todo)
                except TlsRefused as exc:
                    raise LogError(str(exc)) from exc
                except (WireClosed, TimeoutError, OSError, NotYetDecided) as exc:
                    self._drop_pub_wire()
                    if time.monotonic() > deadline:
                        failed = f"append_many not acknowledged for {self.settings.retry_seconds}s{UNACKED}: {exc}"
                        raise LogUnreachable(failed) from exc
                    logger.warning("append_many interrupted ({}); resending {} unacknowledged", exc, len(todo))
                    await asyncio.sleep(0.2)

    def _drop_pub_wire(self) -> None:
        if self._pub_wire is not None:
            self._pub_wire.close()
            self._pub_wire = None

    async def asks(self, subjects: str) -> AsyncIterator[tuple[str, bytes, str]]:
        """(subject, payload, reply subject) of each request on `subjects`, until cancelled: what a
        control-plane service answers off the streams (`events.handover`). Every subscriber gets
        every request; the asker takes the first answer."""
        subscription = await self._nc.subscribe(subjects)  # pyright: ignore[reportUnknownMemberType]
        try:
            async for message in subscription.messages:
                yield message.subject, message.data, message.reply
        finally:
            with contextlib.suppress(nats.errors.Error):
                await subscription.unsubscribe()

    async def respond(self, reply: str, payload: bytes) -> None:
        """Answer a request from `asks` (the server lets the answerer publish on that reply once)."""
        await self._nc.publish(reply, payload)

    async def ask(self, subject: str, payload: bytes, timeout: float) -> bytes:
        """A request on `subject` and its answer's payload; `nats.errors.NoRespondersError` when
        nobody serves it, `nats.errors.TimeoutError` when nobody answered in time."""
        message = await self._nc.request(subject, payload, timeout=timeout)
        return message.data

    async def publish_telemetry(self, event: TelemetryEvent) -> None:
        """Publish a heartbeat to SHOAL_TELEMETRY without waiting for its acknowledgement."""
        headers = {"Nats-Msg-Id": str(event.env.event_id)}
        await self._nc.publish(subject_for(event), encode(event), headers=headers)

    async def flush(self) -> None:
        await self._nc.flush()

    async def reconnected(self, seen: int = 0) -> int:
        """Wait until the connection has come back from a lost server more than `seen` times
        (counted since connect); the new count, to pass next time."""
        return await self._client.reconnects.after(seen)

    # --- reading ----------------------------------------------------------------------------

    @overload
    def replay(
        self,
        from_seq: int | None = None,
        from_time: datetime | None = None,
        subjects: Sequence[str] | None = None,
        stream: Literal["events"] = "events",
    ) -> AsyncIterator[tuple[int, LogEvent]]: ...
    @overload
    def replay(
        self,
        from_seq: int | None = None,
        from_time: datetime | None = None,
        subjects: Sequence[str] | None = None,
        *,
        stream: Literal["telemetry"],
    ) -> AsyncIterator[tuple[int, TelemetryEvent]]: ...
    async def replay(
        self,
        from_seq: int | None = None,
        from_time: datetime | None = None,
        subjects: Sequence[str] | None = None,
        stream: StreamKey = "events",
    ) -> AsyncIterator[tuple[int, AnyEvent]]:
        """(seq, event) from `from_seq` (or `from_time`, or the start) up to the end as of now."""
        decode = _decoder(stream)
        async for batch in self._batches(Position(seq=from_seq, time=from_time), subjects, stream, live=False):
            for seq, message in zip(batch.seqs, batch.messages, strict=True):  # the replay's hot path
                try:
                    event = decode(message.payload)
                except MalformedEvent as exc:
                    self._poison(message.subject, seq, exc)
                    continue
                yield seq, event

    @overload
    def follow(
        self,
        from_seq: int | None = None,
        subjects: Sequence[str] | None = None,
        stream: Literal["events"] = "events",
        from_time: datetime | None = None,
    ) -> AsyncIterator[tuple[int, LogEvent]]: ...
    @overload
    def follow(
        self,
        from_seq: int | None = None,
        subjects: Sequence[str] | None = None,
        *,
        stream: Literal["telemetry"],
        from_time: datetime | None = None,
    ) -> AsyncIterator[tuple[int, TelemetryEvent]]: ...
    async def follow(
        self,
        from_seq: int | None = None,
        subjects: Sequence[str] | None = None,
        stream: StreamKey = "events",
        from_time: datetime | None = None,
    ) -> AsyncIterator[tuple[int, AnyEvent]]:
        """Replay from `from_seq` (default: the start), then continue live until closed/cancelled.

        For new events only, pass `from_seq=await log.last_seq() + 1`.
        """
        async for seq, event in self.entries(from_seq, from_time, subjects, stream, live=True):
            if event is not None:
                yield seq, event

    @overload
    def deliveries(
        self,
        from_seq: int | None = None,
        subjects: Sequence[str] | None = None,
        stream: Literal["events"] = "events",
        *,
        live: bool = True,
        from_time: datetime | None = None,
    ) -> AsyncIterator[tuple[int, LogEvent, bytes]]: ...
    @overload
    def deliveries(
        self,
        from_seq: int | None = None,
        subjects: Sequence[str] | None = None,
        *,
        stream: Literal["telemetry"],
        live: bool = True,
        from_time: datetime | None = None,
    ) -> AsyncIterator[tuple[int, TelemetryEvent, bytes]]: ...
    @overload
    def deliveries(
        self,
        from_seq: int | None = None,
        subjects: Sequence[str] | None = None,
        *,
        stream: StreamKey,
        live: bool = True,
        from_time: datetime | None = None,
    ) -> AsyncIterator[tuple[int, AnyEvent, bytes]]: ...
    async def deliveries(
        self,
        from_seq: int | None = None,
        subjects: Sequence[str] | None = None,
        stream: StreamKey = "events",
        *,
        live: bool = True,
        from_time: datetime | None = None,
    ) -> AsyncIterator[tuple[int, AnyEvent, bytes]]:
        """Like follow (or replay, `live=False`), with the subject each event was stored on: the
        one thing about it the server checked against its publisher's identity. What a fold of
        the bus reads (`events.fold.apply_live(..., subject)`), and a reader of heartbeats that
        trusts them (`events.subjects.route_refusal`)."""
        decode = _decoder(stream)
        async for batch in self._batches(Position(seq=from_seq, time=from_time), subjects, stream, live=live):
            for seq, message in zip(batch.seqs, batch.messages, strict=True):
                try:
                    event = decode(message.payload)
                except MalformedEvent as exc:
                    self._poison(message.subject, seq, exc)
                    continue
                yield seq, event, message.subject

    async def entries(
        self,
        from_seq: int | None = None,
        from_time: datetime | None = None,
        subjects: Sequence[str] | None = None,
        stream: StreamKey = "events",
        *,
        live: bool = False,
        last: bool = False,
    ) -> AsyncIterator[tuple[int, AnyEvent | None]]:
        """Like replay/follow, but a malformed message yields (seq, None) instead of nothing;
        `last`: only the newest message on `subjects`."""
        decode = _decoder(stream)
        position = Position(seq=from_seq, time=from_time, last=last)
        async for batch in self._batches(position, subjects, stream, live=live):
            for seq, message in zip(batch.seqs, batch.messages, strict=True):
                try:
                    event: AnyEvent | None = decode(message.payload)
                except MalformedEvent as exc:
                    self._poison(message.subject, seq, exc)
                    event = None
                yield seq, event

    async def _batches(
        self, position: Position, subjects: Sequence[str] | None, stream: StreamKey, live: bool
    ) -> AsyncIterator[Deliveries]:
        """Batches of stream messages; reconnects and resumes at the last seq + 1 on any doubt."""
        failing_since: float | None = None
        while not self._closed:
            wire: Wire | None = None
            reader: StreamReader | None = None
            try:
                wire = await Wire.open(self.url, tls=self._tls, identity=self.endpoint.identity, name="shoal-read")
                reader = StreamReader(wire, stream_name(stream), list(subjects or ()), live=live)
                async for raw in reader.batches(position):
                    failing_since = None
                    if raw.seqs:
                        position.seq = raw.seqs[-1] + 1
                    yield raw
                    if self._closed:
                        return
                return
            except (TlsRefused, PermissionRefused) as exc:  # the same every time: say it, do not retry
                raise LogError(str(exc)) from exc
            except StreamNotFound as exc:
                if not live:
                    raise LogError(str(exc)) from exc
                logger.warning("following {}: {}; retrying", stream_name(stream), exc)
                await asyncio.sleep(1.0)
            except (ConsumerRestart, WireClosed, WireError, OSError, TimeoutError) as exc:
                now = time.monotonic()
                failing_since = failing_since or now
                if not live and now - failing_since > self.settings.retry_seconds:
                    raise LogUnreachable(f"replay of {stream_name(stream)} failed: {exc}") from exc
                logger.info("reading {} restarts at seq {}: {}", stream_name(stream), position.seq, exc)
                await asyncio.sleep(0.05 if isinstance(exc, ConsumerRestart) else 0.25)
            finally:
                if reader is not None:
                    reader.drop()
                if wire is not None:
                    wire.close()

    async def fold(
        self,
        state: State | None = None,
        *,
        from_snapshot: bool = False,
        finished_tasks_kept: int = FINISHED_TASKS_KEPT,
    ) -> State:
        """Replay SHOAL_EVENTS onto `state` (from its last_seq + 1) up to the current end.

        Without `state`: from the stored snapshot if `from_snapshot` and one fits this log, else
        from empty, keeping `finished_tasks_kept` ended tasks whole (`events.retention`). A head
        trimmed by retention is stepped over like deleted messages, so it never stops a start-up.
        Malformed messages are counted and stepped over; events the fold refuses are quarantined
        in the State (`events.fold`) and logged with their seq, so no poison stops a start-up.
        Works batch by batch (no per-event iterator hop): the fastest way to rebuild a State.
        """
        if state is None:
            snapshot = await read_snapshot(self._js) if from_snapshot else None
            state = snapshot.state if snapshot is not None else State.keeping(finished_tasks_kept)
            state = with_finished_kept(state, finished_tasks_kept)
        folder = Folder(state)
        position = Position(seq=folder.last_seq + 1)
        async for batch in self._batches(position, None, "events", live=False):
            for seq, message in zip(batch.seqs, batch.messages, strict=True):
                try:
                    event = decode_log_event(message.payload)
                except MalformedEvent as exc:
                    self._poison(message.subject, seq, exc)
                    folder.skip_to(seq + 1)
                    continue
                folder.skip_to(seq)  # a gap: messages deleted from the stream
                refused = folder.add(seq, event, message.subject)
                if refused is not None:
                    logger.warning("quarantined {} seq {}: {}", message.subject.decode(errors="replace"), seq, refused)
        return folder.state

    async def write_snapshot(self, state: State) -> int:
        """Store `state` for start-ups to begin from (`eventlog.snapshots`): the leading master's job."""
        return await write_snapshot(self._js, state)

    def _poison(self, subject: str | bytes, seq: int, exc: Exception) -> None:
        self.malformed += 1
        name = subject.decode(errors="replace") if isinstance(subject, bytes) else subject
        logger.warning("skipping malformed message on {} seq {}: {}", name, seq, exc)

    @property
    def connected(self) -> bool:
        """Whether the connection is up now (False while it reconnects through an outage): what a
        health check reports, since follows retry an outage quietly rather than end."""
        return self._nc.is_connected

    async def close(self) -> None:
        """Stop follows at their next batch, and close the connections (`NatsClient.close`: at
        once when the server is frozen or gone)."""
        self._closed = True
        self._drop_pub_wire()
        await self._client.close()


def _decoder(stream: StreamKey) -> Callable[[bytes], AnyEvent]:
    return decode_log_event if stream == "events" else decode_telemetry_event
