"""The API's view of the log: one follow that folds the State and hands each task's events to
whoever is waiting on that task.

A request enters `listen(task_id)` *before* it publishes `TaskCreated`, and the follow delivers
every event stored after that, so no event of the task can be missed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Sequence
from contextlib import contextmanager

from loguru import logger

from eventlog.log import EventLog
from events.catalogue import LogEvent
from events.fold import apply_live
from events.ids import TaskId
from events.state import FINISHED_TASKS_KEPT, State
from services.api.admission import QueueBook
from services.api.dashboard_feed import DashboardFeed
from services.api.metrics import Metrics
from services.supervise import ServiceHealth


class TaskEvents:
    """One listener's events of one task, in log order."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[LogEvent] = asyncio.Queue()

    def put(self, event: LogEvent) -> None:
        self._queue.put_nowait(event)

    async def next(self) -> LogEvent:
        return await self._queue.get()

    def next_nowait(self) -> LogEvent | None:
        """The next event if one is waiting, else None."""
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None


class LogHub:
    def __init__(
        self,
        log: EventLog,
        metrics: Metrics,
        finished_tasks_kept: int = FINISHED_TASKS_KEPT,
        served: Sequence[str] = (),
    ) -> None:
        self.log = log
        self.metrics = metrics
        self.feed = DashboardFeed(served)  # the open dashboard pages
        self.state = State.keeping(finished_tasks_kept)
        self.finished_tasks_kept = finished_tasks_kept
        self.queues = QueueBook()  # each model's queued tasks, for admission
        self.caught_up = asyncio.Event()
        self.follow_health = ServiceHealth()  # the follow's supervisor says when it is down
        self._listeners: dict[TaskId, list[TaskEvents]] = {}

    async def run(self) -> None:
        """Fold the log to its end, then follow it live (until cancelled). Run again after a
        failure (`serve_api` supervises it), it resumes after the last event it folded; the first
        run starts from the stored snapshot."""
        resumed = self.state if self.state.last_seq else None
        self.state = await self.log.fold(resumed, from_snapshot=True, finished_tasks_kept=self.finished_tasks_kept)
        self.queues = QueueBook.of(self.state)
        self.caught_up.set()
        async for seq, event, subject in self.log.deliveries(self.state.last_seq + 1):
            if not self._apply(seq, event, subject):
                continue  # a refused event (a forged chunk...) never reaches a client's stream
            for listener in self._listeners.get(getattr(event, "task_id", TaskId("")), ()):
                listener.put(event)

    @property
    def degraded(self) -> str:
        """Why the API cannot serve from the log now ("" when it can): its follow is down and
        restarting, or its NATS connection is reconnecting."""
        if self.follow_health.degraded:
            return f"log follow down: {self.follow_health.last_error}"
        return "" if self.log.connected else "NATS connection lost; reconnecting"

    def _apply(self, seq: int, event: LogEvent, subject: bytes) -> bool:
        """Fold one event (read from `subject`); False when the fold refused (quarantined) it."""
        before = self.state
        self.state, error = apply_live(before, seq, event, subject)
        self.queues.folded(before, self.state, event)
        if error is not None:
            logger.warning("api: skipping seq {}: {}", seq, error)
            return False
        self.metrics.observe(self.state, event)
        self.feed.folded(before, self.state, event)
        return True

    @property
    def listening(self) -> int:
        """How many tasks some request is following now."""
        return len(self._listeners)

    @contextmanager
    def listen(self, task_id: TaskId) -> Generator[TaskEvents]:
        """The task's events stored while the block runs: `with hub.listen(task_id) as events:`."""
        events = TaskEvents()
        self._listeners.setdefault(task_id, []).append(events)
        try:
            yield events
        finally:
            listeners = self._listeners.get(task_id, [])
            listeners.remove(events)
            if not listeners:
                self._listeners.pop(task_id, None)
