"""The runner's single appends over a connection of their own (`eventlog.appender`), on a real
nats-server: stored in order, once per event id, and across a stopped server `LogUnreachable`
until it is back, as `EventLog.append`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

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
