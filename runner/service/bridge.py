"""The runner's link to the event log, on its own thread, so the MLX thread never awaits.

The MLX thread calls:
- `publish(event)` / `publish_telemetry(event)`: queued, appended in order by one task;
- `is_cancelled(task_id)`: a set lookup, filled by a consumer of every task's cancel and
  failure subjects *from the log* (a cancel published before the runner looked is not missed);
- `next_assignment(timeout)`: the instance's `TaskAssigned`s (with their `TaskCreated`), in log
  order on every rank;
- `fetch(subject)`: the newest event on a subject (a task's `TaskCreated`).
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, NamedTuple, TypeVar

from loguru import logger

from eventlog.log import EventLog
from events.catalogue import AnyEvent, LogEvent, TaskAssigned, TaskCreated, TaskFailed, TelemetryEvent
from events.subjects import task_subject

T = TypeVar("T")


class Assignment(NamedTuple):
    assigned: TaskAssigned
    created: TaskCreated | None  # None: created before the runner started watching; fetch it


ASSIGNED = task_subject("*", "assigned")
CREATED = task_subject("*", "created")
CREATED_CACHE_SIZE = 4096  # tasks created but not yet assigned that we remember
STOPPING_SUBJECTS = (task_subject("*", "cancelled"), task_subject("*", "failed"))


class LogBridge:
    def __init__(self, nats_url: str) -> None:
        self._url = nats_url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="log-bridge", daemon=True)
        self._log: EventLog | None = None
        self._outbox: asyncio.Queue[LogEvent | TelemetryEvent | None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping: set[str] = set()
        self._stopping_lock = threading.Lock()
        self._assignments: queue.Queue[Assignment] = queue.Queue()
        self._created: collections.OrderedDict[str, TaskCreated] = collections.OrderedDict()
        self.publish_errors = 0

    # --- lifecycle (MLX thread) -------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        self._call(self._open(), timeout)

    def watch(self, instance_id: str, from_seq: int) -> None:
        """Start consuming assignments for `instance_id` and every task's stop subjects."""
        self._call(self._watch(instance_id, from_seq), 10.0)

    def close(self, timeout: float = 5.0) -> None:
        """Publish what is queued, then stop the loop and the thread."""
        if self._thread.is_alive():
            try:
                self._call(self._close(), timeout)
            except Exception as exc:  # closing is best-effort: the process is exiting anyway
                logger.warning("log bridge did not close cleanly: {}", exc)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    # --- MLX-thread API ---------------------------------------------------------------------

    def publish(self, event: LogEvent | TelemetryEvent) -> None:
        outbox = self._outbox
        if outbox is None:
            raise RuntimeError("log bridge is not started")
        self._loop.call_soon_threadsafe(outbox.put_nowait, event)

    def is_cancelled(self, task_id: str) -> bool:
        with self._stopping_lock:
            return task_id in self._stopping

    def next_assignment(self, timeout: float) -> Assignment | None:
        try:
            return self._assignments.get(timeout=timeout)
        except queue.Empty:
            return None

    def fetch(self, subject: str, timeout: float = 10.0) -> AnyEvent | None:
        found = self.fetch_entry(subject, timeout)
        return None if found is None else found[1]

    def fetch_entry(self, subject: str, timeout: float = 10.0) -> tuple[int, AnyEvent] | None:
        """(seq, event) of the newest event on `subject`, or None."""
        return self._call(self._get_last(subject), timeout)

    def flush(self, timeout: float = 10.0) -> None:
        """Block until every event published so far is stored."""
        self._call(self._drain(), timeout)

    # --- loop side --------------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    async def _open(self) -> None:
        self._log = await EventLog.connect(self._url, name="shoal-runner")
        self._outbox = asyncio.Queue()
        self._tasks.append(asyncio.create_task(self._publisher()))

    async def _watch(self, instance_id: str, from_seq: int) -> None:
        self._tasks.append(asyncio.create_task(self._consume_assignments(instance_id, from_seq)))
        self._tasks.append(asyncio.create_task(self._consume_stops(from_seq)))

    async def _publisher(self) -> None:
        assert self._outbox is not None and self._log is not None
        while True:
            event = await self._outbox.get()
            try:
                if event is None:
                    return
                if isinstance(event, TelemetryEvent):
                    await self._log.publish_telemetry(event)
                else:
                    await self._log.append(event)
            except Exception as exc:  # a lost progress event must not kill the runner
                self.publish_errors += 1
                logger.error("could not publish {}: {}", type(event).__name__, exc)
            finally:
                self._outbox.task_done()

    async def _consume_assignments(self, instance_id: str, from_seq: int) -> None:
        """Assignments in log order, each with its TaskCreated when it came after `from_seq`
        (one consumer for both saves the runner a request per task on the way to first token)."""
        assert self._log is not None
        async for _seq, event in self._log.follow(from_seq=from_seq, subjects=[CREATED, ASSIGNED]):
            if isinstance(event, TaskCreated):
                self._created[event.task_id] = event
                if len(self._created) > CREATED_CACHE_SIZE:
                    self._created.popitem(last=False)
            elif isinstance(event, TaskAssigned):
                created = self._created.pop(event.task_id, None)
                if event.instance_id == instance_id:
                    self._assignments.put(Assignment(event, created))

    async def _consume_stops(self, from_seq: int) -> None:
        assert self._log is not None
        async for _seq, event in self._log.follow(from_seq=from_seq, subjects=list(STOPPING_SUBJECTS)):
            task_id = getattr(event, "task_id", None)
            if task_id is not None:
                if isinstance(event, TaskFailed) and event.env.origin.service == "runner":
                    continue  # a rank's own failure report is not a reason for the others to stop
                with self._stopping_lock:
                    self._stopping.add(task_id)

    async def _get_last(self, subject: str) -> tuple[int, AnyEvent] | None:
        assert self._log is not None
        return await self._log.get_last(subject)

    async def _drain(self) -> None:
        if self._outbox is not None:
            await self._outbox.join()

    async def _close(self) -> None:
        await self._drain()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._log is not None:
            await self._log.close()
