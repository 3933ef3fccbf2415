"""A stream that waits hears from the API: an SSE comment every `sse_keepalive_seconds` of
silence, whatever it waits for — a place in the queue (with or without progress chunks asked for)
or its next token after the first (a decode held up by a fault, until the master's stall
deadline). A proxy or a NAT keeps such a connection, and a client can tell a waiting stream from a
dead connection: silence for a few intervals (the chaos bench's clients, `bench/chaos_client.py`).
The app on a real nats-server, driven as an ASGI server drives it; no master, so nothing but this
test moves the task on."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from starlette.types import Message

from eventlog.log import EventLog
from services.config import ShoalConfig
from tests.events.builders import Events
from tests.services.test_api import Client, chat, running_api

pytestmark = pytest.mark.timeout(60)
INTERVAL_S = 0.2
COMMENT = ": keepalive\n\n"
HEARD = 3  # comments each test waits for: a period, not a one-off


class TimedClient(Client):
    """A `Client` that notes when each body part came (anyio's clock, the API's own)."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__("POST", "/v1/chat/completions", body)
        self.arrivals: list[tuple[float, str]] = []

    async def send(self, message: Message) -> None:
        await super().send(message)
        if message.get("body"):
            self.arrivals.append((anyio.current_time(), message["body"].decode()))

    def comments_after(self, text: str | None = None) -> list[float]:
        """When each keepalive came (after the part holding `text`, if given; none before it came)."""
        holding = [i for i, (_, part) in enumerate(self.arrivals) if text is not None and text in part]
        if text is not None and not holding:
            return []
        start = holding[0] + 1 if holding else 0
        return [at for at, part in self.arrivals[start:] if part == COMMENT]


async def _until(condition: Any, seconds: float = 20.0) -> None:
    with anyio.fail_after(seconds):
        while not condition():
            await anyio.sleep(0.01)


def _spaced(times: list[float], after: float) -> bool:
    """Every comment came an interval or more after the byte before it (never more often)."""
    return all(later - earlier >= INTERVAL_S * 0.99 for earlier, later in zip([after, *times], times, strict=False))


@pytest.mark.parametrize("progress", [False, True], ids=["plain", "include_progress"])
async def test_a_queued_stream_is_sent_a_keepalive_every_interval(event_log: EventLog, progress: bool) -> None:
    ev = Events()
    await event_log.append(ev.node("n1"))  # a node is up, so the task is taken; no master ever assigns it
    body = chat(stream=True) | ({"stream_options": {"include_progress": True}} if progress else {})
    async with (
        running_api(event_log, ShoalConfig(sse_keepalive_seconds=INTERVAL_S)) as (_ctx, app),
        anyio.create_task_group() as group,
    ):
        client = TimedClient(body)
        group.start_soon(client.run, app)
        await _until(lambda: len(client.comments_after()) >= HEARD)
        assert client.status == 200
        opened = client.arrivals[0][0]
        assert _spaced(client.comments_after()[:HEARD], opened)
        client.disconnect()


async def test_a_stream_whose_tokens_stop_coming_is_sent_keepalives_again(event_log: EventLog) -> None:
    """After its first token too: a rank stopped mid-decode leaves the stream silent until the
    master's stall deadline fails the task, which is many keepalive intervals."""
    ev = Events()
    await event_log.append_many([ev.node("n1"), ev.placed("i1", nodes=("n1",))])
    async with (
        running_api(event_log, ShoalConfig(sse_keepalive_seconds=INTERVAL_S)) as (_ctx, app),
        anyio.create_task_group() as group,
    ):
        client = TimedClient(chat(stream=True))
        group.start_soon(client.run, app)
        await client.started.wait()
        await event_log.append_many([ev.assigned(client.task_id, "i1"), ev.chunk(client.task_id, text="Once")])
        await _until(lambda: len(client.comments_after("Once")) >= HEARD)
        token_at = next(at for at, part in client.arrivals if "Once" in part)
        assert _spaced(client.comments_after("Once")[:HEARD], token_at)
        client.disconnect()


async def test_no_keepalive_when_set_to_zero(event_log: EventLog) -> None:
    ev = Events()
    await event_log.append(ev.node("n1"))
    async with (
        running_api(event_log, ShoalConfig(sse_keepalive_seconds=0)) as (_ctx, app),
        anyio.create_task_group() as group,
    ):
        client = TimedClient(chat(stream=True))
        group.start_soon(client.run, app)
        await client.started.wait()
        await anyio.sleep(HEARD * INTERVAL_S * 2)  # the silence that would have brought comments
        assert client.comments_after() == []
        client.disconnect()
