"""follow() across a NATS server restart: every event once, in order (a server of the test's own)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from contextlib import aclosing

import anyio.to_thread
import pytest

from eventlog.client import CLOSE_FLUSH_SECONDS, DRAIN_SECONDS
from eventlog.log import EventLog
from events.synthetic import synthetic_history
from services.nats import EmbeddedNats
from tests.freeze import freeze


async def test_follow_across_a_server_restart_loses_and_repeats_nothing(
    make_nats: Callable[..., EmbeddedNats],
) -> None:
    server = await anyio.to_thread.run_sync(make_nats("restart").start)
    events = synthetic_history(3000)
    writer = await EventLog.connect(server.url)
    follower = await EventLog.connect(server.url)
    seen: list[int] = []
    ids: list[str] = []

    async def follow() -> None:
        async with aclosing(follower.follow(from_seq=1)) as stream:
            async for seq, event in stream:
                seen.append(seq)
                ids.append(event.env.event_id)
                if seq == len(events):
                    return

    try:
        async with asyncio.timeout(60):
            reader = asyncio.create_task(follow())
            await writer.append_many(events[:1000])
            while len(seen) < 500:  # restart while the follower is mid-stream
                await asyncio.sleep(0.005)
            await anyio.to_thread.run_sync(server.stop)
            await asyncio.sleep(0.3)
            await anyio.to_thread.run_sync(server.start)
            await writer.append_many(events[1000:2000])  # reconnects, resends what was not acknowledged
            for event in events[2000:2100]:
                await writer.append(event)
            await writer.append_many(events[2100:])
            await reader
    finally:
        await writer.close()
        await follower.close()
    assert seen == list(range(1, len(events) + 1))
    assert ids == [event.env.event_id for event in events]


async def test_close_does_not_wait_on_a_frozen_server(make_nats: Callable[..., EmbeddedNats]) -> None:
    """A server that stopped answering (SIGSTOP: a frozen VM, a paused container): closing the log
    is prompt; nats-py's drain would wait its timeout, then 10 s for a flush (before: 40 s)."""
    server = await anyio.to_thread.run_sync(make_nats("frozen").start)
    log = await EventLog.connect(server.url)

    async def first_event() -> object:
        async with aclosing(log.follow()) as events:
            return await anext(events)

    follow = asyncio.create_task(first_event())
    await log.append(synthetic_history(1)[0])
    await asyncio.wait_for(follow, 10)
    assert server.pid is not None
    freeze(server.pid)
    try:
        started = time.monotonic()
        await asyncio.wait_for(log.close(), 30)
        assert time.monotonic() - started < CLOSE_FLUSH_SECONDS + 2
    finally:
        os.kill(server.pid, signal.SIGCONT)


async def test_close_does_not_wait_on_a_server_that_stops_answering_mid_drain(
    make_nats: Callable[..., EmbeddedNats], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server answers the close's first flush, then stops (one Ctrl-C stopping `shoal nats`
    and `shoal events tail` together): nats-py's drain would wait its timeout, then 10 s for a
    flush (15 s: a CI run's `events tail` outlived its test that way); now at most DRAIN_SECONDS."""
    server = await anyio.to_thread.run_sync(make_nats("mid-drain").start)
    log = await EventLog.connect(server.url)
    assert server.pid is not None
    pid = server.pid
    client = log._client  # pyright: ignore[reportPrivateUsage]
    answered = client._answers  # pyright: ignore[reportPrivateUsage]

    async def answers_then_freezes() -> bool:
        result = await answered()
        freeze(pid)
        return result

    monkeypatch.setattr(client, "_answers", answers_then_freezes)
    await client.nc.subscribe("mid-drain.>")  # something to drain
    try:
        started = time.monotonic()
        await asyncio.wait_for(log.close(), 30)
        assert time.monotonic() - started < DRAIN_SECONDS + 2
        assert client.nc.is_closed
    finally:
        os.kill(pid, signal.SIGCONT)
