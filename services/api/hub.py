"""The API's view of the log: one follow that folds the State and hands each task's events to
whoever is waiting on that task.

A request registers its listener *before* it publishes `TaskCreated`, and the follow delivers
every event stored after that, so no event of the task can be missed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from loguru import logger

from eventlog.log import EventLog
from events.apply import apply_live
from events.catalogue import LogEvent
from events.ids import TaskId
from events.state import State
from services.api.metrics import Metrics


class LogHub:
    def __init__(self, log: EventLog, metrics: Metrics) -> None:
        self.log = log
        self.metrics = metrics
        self.state = State()
        self.caught_up = asyncio.Event()
        self._listeners: dict[TaskId, list[asyncio.Queue[LogEvent]]] = {}

    async def run(self) -> None:
        """Fold the log to its end, then follow it live (until cancelled)."""
        self.state = await self.log.fold()
        self.caught_up.set()
        async for seq, event in self.log.follow(from_seq=self.state.last_seq + 1):
            self._apply(seq, event)
            for listener in self._listeners.get(getattr(event, "task_id", TaskId("")), ()):
                listener.put_nowait(event)

    def _apply(self, seq: int, event: LogEvent) -> None:
        self.state, error = apply_live(self.state, seq, event)
        if error is not None:
            logger.warning("api: skipping seq {}: {}", seq, error)
            return
        self.metrics.observe(self.state, event)

    def listen(self, task_id: TaskId) -> TaskListener:
        return TaskListener(self, task_id)

    def _add(self, task_id: TaskId, queue: asyncio.Queue[LogEvent]) -> None:
        self._listeners.setdefault(task_id, []).append(queue)

    def _remove(self, task_id: TaskId, queue: asyncio.Queue[LogEvent]) -> None:
        queues = self._listeners.get(task_id, [])
        if queue in queues:
            queues.remove(queue)
        if not queues:
            self._listeners.pop(task_id, None)


class TaskListener:
    """Use as `with hub.listen(task_id) as events:` then `async for event in events`."""

    def __init__(self, hub: LogHub, task_id: TaskId) -> None:
        self._hub = hub
        self._task_id = task_id
        self._queue: asyncio.Queue[LogEvent] = asyncio.Queue()

    def __enter__(self) -> TaskListener:
        self._hub._add(self._task_id, self._queue)  # pyright: ignore[reportPrivateUsage]
        return self

    def __exit__(self, *exc: object) -> None:
        self._hub._remove(self._task_id, self._queue)  # pyright: ignore[reportPrivateUsage]

    def __aiter__(self) -> AsyncIterator[LogEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[LogEvent]:
        while True:
            yield await self._queue.get()
