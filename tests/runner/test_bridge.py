"""The runner's log bridge against a real nats-server: what it carries, and what a crashed task of it
does to the MLX thread (it must raise at once, never leave a rank waiting forever)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog
from events.catalogue import TaskAssigned, TaskCancelled
from events.ids import TaskId
from events.subjects import subject_for, task_subject
from runner.service.bridge import LogBridge, LogBridgeDown, OpenLog, open_runner_log
from tests.events.builders import Events

pytestmark = pytest.mark.timeout(60)
CRASH_TASK = "crash-the-follow"


class FollowCrashes(EventLog):
    """The real log, except that a follow raises at a `TaskAssigned` of CRASH_TASK: a bug in a
    bridge task, on demand."""

    async def follow(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        async for seq, event in super().follow(*args, **kwargs):
            if isinstance(event, TaskAssigned) and event.task_id == CRASH_TASK:
                raise RuntimeError("injected: the follow broke")
            yield seq, event


async def watching_bridge(nats_url: str, open_log: OpenLog = open_runner_log) -> LogBridge:
    """A bridge built, started and watching instance i1 as a runner's main thread does it: on a
    thread without an event loop."""

    def build() -> LogBridge:
        bridge = LogBridge(NatsEndpoint(url=nats_url), Events().rank("i1", 0), open_log=open_log)
        bridge.start()
        bridge.watch("i1", 1)
        return bridge

    return await asyncio.to_thread(build)


async def test_assignments_cancels_and_publishes_go_through(event_log: EventLog, nats_url: str) -> None:
    ev = Events()
    bridge = await watching_bridge(nats_url)
    try:
        await event_log.append_many([ev.created("t1"), ev.assigned("t2", "i2"), ev.assigned("t1", "i1")])
        assignment = await asyncio.to_thread(bridge.next_assignment, 10.0)
        assert assignment is not None and assignment.assigned.task_id == "t1"
        assert assignment.created is None and assignment.seq == 3  # its request: asked of the masters
        assert await asyncio.to_thread(bridge.next_assignment, 0.2) is None  # t2 is another instance's

        await event_log.append(TaskCancelled(env=ev.api.stamp(), task_id=TaskId("t1"), reason="api"))
        deadline = time.monotonic() + 10
        while not bridge.is_cancelled("t1") and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert bridge.is_cancelled("t1") and not bridge.is_cancelled("t2")

        chunk = ev.chunk("t1", text="from the runner")
        bridge.publish(chunk)
    finally:
        await asyncio.to_thread(bridge.close)  # publishes what is queued first
    stored = await event_log.get_last(subject_for(chunk))
    assert stored is not None and stored[1] == chunk
    with pytest.raises(LogBridgeDown, match="closed"):
        bridge.next_assignment(0)


async def test_a_crashed_bridge_task_wakes_a_blocked_next_assignment(event_log: EventLog, nats_url: str) -> None:
    ev = Events()
    bridge = await watching_bridge(nats_url, FollowCrashes.connect)
    try:
        waiting = asyncio.create_task(asyncio.to_thread(bridge.next_assignment, 50.0))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # blocked, as a rank between tasks is

        crashed_at = time.monotonic()
        await event_log.append(ev.assigned(CRASH_TASK, "i1"))
        with pytest.raises(LogBridgeDown, match="assignment consumer crashed: RuntimeError: injected"):
            await asyncio.wait_for(waiting, 45)
        assert time.monotonic() - crashed_at < 5.0  # at once, not after next_assignment's 50 s

        # Every other call of the MLX thread raises the same error, without waiting.
        started = time.monotonic()
        for call in (
            lambda: bridge.next_assignment(30.0),
            lambda: bridge.publish(ev.chunk("t1")),
            lambda: bridge.is_cancelled("t1"),
            lambda: bridge.fetch(task_subject("t1", "created"), timeout=30.0),
        ):
            with pytest.raises(LogBridgeDown, match="crashed"):
                call()
        assert time.monotonic() - started < 1.0
    finally:
        await asyncio.to_thread(bridge.close)
