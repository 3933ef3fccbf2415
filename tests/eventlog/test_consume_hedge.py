"""A consumer create that is never answered (the server it was placed on died a moment ago: an R1
consumer of an R3 stream goes to a replica the JetStream leader still counts as alive) is joined
by another try on the same connection, rather than costing the reader its whole create timeout
and its connection. The loss is real: a TCP relay in front of a real nats-server drops the first
`$JS.API.CONSUMER.CREATE` request a client sends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from eventlog.consume import Position, StreamReader
from eventlog.log import EventLog
from eventlog.wire import Wire, split_servers
from events.synthetic import synthetic_history

CREATE = b"$JS.API.CONSUMER.CREATE."


class CreateDropper:
    """Relays NATS client connections to `upstream`, dropping the first `drop` consumer creates
    (whole `PUB`/`HPUB` frames) the clients send; counts connections and creates."""

    def __init__(self, upstream: tuple[str, int], drop: int) -> None:
        self.upstream = upstream
        self.left_to_drop = drop
        self.connections = 0
        self.creates = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        relays = (self._client_to_server(reader, up_writer), self._pipe(up_reader, writer))
        tasks = [asyncio.create_task(relay) for relay in relays]
        self._tasks.update(tasks)
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        writer.close()
        up_writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()

    async def _client_to_server(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pending = b""
        while data := await reader.read(65536):
            pending += data
            out = b""
            while (frame_end := _frame_end(pending)) is not None:
                frame, pending = pending[:frame_end], pending[frame_end:]
                if frame[:5] in (b"PUB $", b"HPUB ") and frame.split(b" ", 2)[1].startswith(CREATE):
                    self.creates += 1
                    if self.left_to_drop:
                        self.left_to_drop -= 1
                        continue
                out += frame
            writer.write(out)
            await writer.drain()

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()


def _frame_end(buffer: bytes) -> int | None:
    """Where the first whole client frame in `buffer` ends (a PUB/HPUB with its payload), or None."""
    line_end = buffer.find(b"\r\n")
    if line_end < 0:
        return None
    line = buffer[:line_end]
    if not (line.startswith(b"PUB ") or line.startswith(b"HPUB ")):
        return line_end + 2
    total = int(line.rsplit(b" ", 1)[1])
    end = line_end + 2 + total + 2
    return end if len(buffer) >= end else None


@pytest.fixture
async def dropper(nats_url: str) -> AsyncIterator[tuple[CreateDropper, str]]:
    host, port, _auth = split_servers(nats_url)[0]
    relay = CreateDropper((host, port), drop=1)
    server = await asyncio.start_server(relay.serve, "127.0.0.1", 0)
    relay_port = server.sockets[0].getsockname()[1]
    try:
        yield relay, f"nats://127.0.0.1:{relay_port}"
    finally:
        relay.close()
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()


async def test_a_lost_consumer_create_is_joined_by_another_on_the_same_connection(
    event_log: EventLog, dropper: tuple[CreateDropper, str]
) -> None:
    relay, url = dropper
    await event_log.append_many(synthetic_history(20))
    wire = await Wire.open(url)
    reader = StreamReader(wire, "SHOAL_EVENTS", [], live=False)
    try:
        seqs = [seq async for batch in reader.batches(Position(seq=1)) for seq in batch.seqs]
    finally:
        reader.drop()
        wire.close()
    assert seqs == list(range(1, 21))
    assert relay.left_to_drop == 0, "the relay never saw a consumer create to drop"
    assert (relay.connections, relay.creates) == (1, 2), "one connection: the lost create was not waited out"
