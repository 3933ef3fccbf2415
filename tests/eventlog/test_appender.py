"""The runner's single appends over a connection of their own (`eventlog.appender`), on a real
nats-server: stored in order, once per event id, and across a stopped server `LogUnreachable`
until it is back, as `EventLog.append`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import anyio.to_thread
import pytest

from eventlog.appender import Appender
from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog
from eventlog.publish import LogError, LogUnreachable
from services.nats import EmbeddedNats
from tests.events.builders import Events

pytestmark = pytest.mark.timeout(60)


async def test_appends_are_stored_in_order_and_a_resend_is_stored_once(event_log: EventLog, nats_url: str) -> None:
    ev = Events()
    chunks = [ev.chunk("t1", index=i, text=f"w{i} ") for i in range(50)]
    appender = Appender(NatsEndpoint(url=nats_url), retry_seconds=5.0)
    try:
        seqs = [await appender.append(chunk) for chunk in chunks]
        assert await appender.append(chunks[10]) == seqs[10]  # same event id: the original's seq
    finally:
        appender.close()
    assert seqs == list(range(seqs[0], seqs[0] + len(chunks)))
    replayed = [event async for _seq, event in event_log.replay(from_seq=1)]
    assert [e.env.event_id for e in replayed] == [c.env.event_id for c in chunks]


async def test_pipelined_appends_are_stored_in_order_once_each(event_log: EventLog, nats_url: str) -> None:
    ev = Events()
    chunks = [ev.chunk(f"t{i}", index=0, text=f"w{i} ") for i in range(40)]
    appender = Appender(NatsEndpoint(url=nats_url), retry_seconds=5.0)
    try:
        first = await appender.append_pipelined(chunks[:25])
        again = await appender.append_pipelined(chunks[20:])  # 20-24 were stored: the originals' seqs
        single = await appender.append(chunks[3])
    finally:
        appender.close()
    assert first == list(range(first[0] or 0, (first[0] or 0) + 25))
    assert again[:5] == first[20:] and again[5:] == list(range((first[-1] or 0) + 1, (first[-1] or 0) + 16))
    assert single == first[3]
    replayed = [event async for _seq, event in event_log.replay(from_seq=1)]
    assert [e.env.event_id for e in replayed] == [c.env.event_id for c in chunks]


async def test_pipelined_appends_to_a_stopped_server_are_none_and_the_next_try_stores_them(
    make_nats: Callable[..., EmbeddedNats],
) -> None:
    """No resend inside: what was not acknowledged comes back None, for the caller to resend."""
    server = await anyio.to_thread.run_sync(make_nats("pipelined").start)
    log = await EventLog.connect(server.url)
    ev = Events()
    chunks = [ev.chunk(f"t{i}", index=0) for i in range(5)]
    appender = Appender(NatsEndpoint(url=server.url), retry_seconds=0.5)
    try:
        assert None not in await appender.append_pipelined(chunks[:2])
        await anyio.to_thread.run_sync(server.stop)
        assert await appender.append_pipelined(chunks[2:]) == [None, None, None]
        await anyio.to_thread.run_sync(server.start)
        async with asyncio.timeout(30):
            while None in (seqs := await appender.append_pipelined(chunks)):  # JetStream answers a little later
                await asyncio.sleep(0.1)
        assert seqs == list(range(1, 6))  # the first two once, the rest after them
    finally:
        appender.close()
        await log.close()


async def test_a_stopped_server_is_unreachable_then_appends_resume(make_nats: Callable[..., EmbeddedNats]) -> None:
    server = await anyio.to_thread.run_sync(make_nats("appender").start)
    log = await EventLog.connect(server.url)
    ev = Events()
    appender = Appender(NatsEndpoint(url=server.url), retry_seconds=0.5)
    try:
        first = await appender.append(ev.chunk("t1", index=0))
        await anyio.to_thread.run_sync(server.stop)
        with pytest.raises(LogUnreachable, match=r"not acknowledged for 0\.5s"):
            await appender.append(ev.chunk("t1", index=1))
        await anyio.to_thread.run_sync(server.start)
        async with asyncio.timeout(30):
            while True:  # JetStream answers a little after the server listens
                try:
                    second = await appender.append(ev.chunk("t1", index=1))
                    break
                except LogUnreachable:
                    continue
        assert second == first + 1
    finally:
        appender.close()
        await log.close()


async def test_an_event_over_the_servers_payload_limit_is_refused_not_retried(
    event_log: EventLog, nats_url: str
) -> None:
    appender = Appender(NatsEndpoint(url=nats_url), retry_seconds=30.0)
    try:
        with pytest.raises(LogError, match="Maximum Payload Violation"):
            await appender.append(Events().chunk("t1", text="x" * (2 << 20)))
        assert await appender.append(Events().chunk("t1", index=0)) > 0  # the next one goes through
    finally:
        appender.close()


async def test_a_connection_the_server_dropped_while_idle_is_replaced_at_once(tmp_path: Path) -> None:
    """An appender reads its connection only while it appends, so an idle one leaves the server's
    PINGs unanswered and the server drops it as stale; the next append opens a new connection at
    once (no retry pause, no `LogUnreachable`)."""
    config = tmp_path / "stale.conf"
    config.write_text('ping_interval: "200ms"\nping_max: 1\n')
    server = EmbeddedNats(data_dir=tmp_path / "stale", port=0, config_file=config)
    await anyio.to_thread.run_sync(server.start)
    log = await EventLog.connect(server.url)
    ev = Events()
    appender = Appender(NatsEndpoint(url=server.url), retry_seconds=0.5)
    try:
        first = await appender.append(ev.chunk("t1", index=0))
        stale = appender._wire
        await asyncio.sleep(1.5)  # several ping intervals, unanswered
        started = time.monotonic()
        second = await appender.append(ev.chunk("t1", index=1))
        assert second == first + 1
        assert appender._wire is not stale  # the dropped connection was replaced
        assert time.monotonic() - started < 0.5
    finally:
        appender.close()
        await log.close()
        await anyio.to_thread.run_sync(server.stop)
